"""Views over stored runs and this box; it imports run and everything below it.

    compare    the studies' comparison tables over stored runs, and a run's headline numbers
    labels     what the tables call a run (VMM, target, driver, NIC), their markers and caveat words
    render     a table as text, markdown or CSV; whole runs as JSON (the export)
    rundetail  one run's configuration, provenance, table and raw output: what `results show` prints
    host       what this box is and has, for the overview
    readiness  whether this box is ready: virtualization, IOMMU, Secure Boot, each disk and NIC, read-only
"""
