"""What a run leaves behind and how it is kept; it imports virt, disks and spec below it.

    results     the results store (SQLite): runs, measurements, host samples, events
    schema      the store's tables and their migrations, to SCHEMA_VERSION
    rows        the store's rows as records (Run, Measurement, Event, Sample), a figure's samples, reading a run back
    events      a run's live events as typed records and their one rendering as a line
    provenance  everything that says where and how a run's numbers were measured
    hoststate   the host's state that moves figures (CPU, idle states, THP, NUMA, disk, NIC), and what differs
    runlock     one active run per host (and per enrolled node)
    fairness    how N guests shared the host: the aggregate and how evenly it was split
    stats       a figure over its samples: the median's interval, a ratio's and a shift's interval, spread, drift
    latency     fio's completion-latency histograms: its bins, merged over samples, percentiles, latency added
"""
