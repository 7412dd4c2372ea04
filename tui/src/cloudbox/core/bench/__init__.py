"""The benchmarks: the tools a test runs, on bare metal and in the guest, and what they print; it imports record,
virt, disks and spec below it.

    storage      fio, dd, IOzone and Bonnie++: command lines, parsers, the host's and the guest's runners
    nettests     netperf and iperf3: command lines, parsers, hang detection, the guest's and the baseline's runs
    mpiio        parallel I/O across guests with Open MPI (IOR's parameters)
    iscsiperf    libiscsi's iscsi-perf: an iSCSI volume's reads from the host domain
    propagation  image propagation (study B): copy and boot times against the image's size
"""
