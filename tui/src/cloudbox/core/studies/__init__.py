"""The published studies as data, and what stored runs say about them; it imports views and everything below it.

    schema      the study file's models: the matrix, the paper's numbers, the rules, a series' and a sweep's plans
    loading     study files parsed, checked against the profiles and found; whether a profile can run here
    cells       a cell as a stored run measured it: the guest's number beside bare metal's, and its qualifiers
    verdicts    each rule over the cells: reproduced, not reproduced or inconclusive, with the reasons
    series      a series study's repeats per cell and their distribution (stats, histogram bins, density)
    imagesweep  study B's image-propagation sweep: its stored samples, the samples to do, its fitted line
    evidence    what the store holds for a study: the chosen cells, verdicts, series and sweep, and its summary
    cellstates  where each cell of the matrix stands: done, failed, running, not run, cannot run
    planning    a study run: the cells, repeats and samples still to measure as runs, and their space check
    progress    a study run under way: its cells done of those planned, and its time left from the plan
    wording     how the report writes a number and its qualifiers, in tables and figures alike
    plot        the drawing the SVG figures share: opening, plot area, scales, marks, colours
    svg         the report's figures: % of native bars, the host disk, a series, the sweep, IOzone's sweeps
    markdown    the report in Markdown: the paper's tables with ours beside, sweep, variability, findings
    html        the report as one HTML page, a figure after each table; the formats by name
    capability  what this box can answer: each study's cells that can run here, and what the others need
    agreement   two measurements of a study side by side: where each rule's interval lies, and which flip

Within the package, each module imports only those listed above it, in no circle (the acyclic_siblings contract):
schema and cells first, the verdicts, series and sweep over them, then evidence, the cell states, the planning and
its progress, the report (wording, plot, svg, markdown, html), what a box can answer, and two
measurements side by side last.
"""
