"""The published studies as data, and what stored runs say about them; it imports views and everything below it.

    studies      the study files: schema, planning, the cells chosen from stored runs, and the verdicts
    studyreport  a study's report in Markdown or HTML, with its figures
"""
