"""The benchmarks: the tools a test runs, on bare metal and in the guest, and what they print; it imports record,
virt, disks and spec below it.

    result       FioResult, the figures every storage tool's run gives back, and the guest scripts' elapsed line
    fio          fio: command line, job file, nbd engine, its JSON, status-line and --client parsers
    dd           dd: command line, the guest's timed wrapper, its parser
    iozone       IOzone: one pass, the file sweep and the record grid: command lines, parsers, metric names
    bonnie       Bonnie++: ext4 on the disk, command line, the guest's script, its CSV parser
    progress     what IOzone, dd and Bonnie++ have done of a test's plan while they run, and its time left
    runners      the host's and the guest's runners of a storage test, cache drops, fills, guest timeouts
    diskwatch    a guest disk that stops completing requests: the watch and the test it kills
    barrier      N guests' tests started at one instant: the uptime barrier and its stamp
    nettests     netperf and iperf3: command lines, parsers, hang detection, the guest's and the baseline's runs
    mpiio        parallel I/O across guests with Open MPI (IOR's parameters)
    iscsiperf    libiscsi's iscsi-perf: an iSCSI volume's reads from the host domain
    propagation  image propagation (study B): copy and boot times against the image's size
"""
