"""What a guest's disk and the bare-metal baseline sit on; it imports spec below it.

    backing    backing stores (files, qcow2, a whole device or a loop device), made per run and removed
    hostraid   RAID 0 built by the host over a run's loop devices
    diskstats  iostat-style host disk metrics, sampled once a second
    claims     files the host's tools write where others write too (an NFS export), made and held by cloudbox
    mounts     mounts a run makes on this host, and taking them down
    vhostuser  a store served to the guest as vhost-user-blk by qemu-storage-daemon
    pcidev     a whole NVMe controller of this host handed to the guest by VFIO, named by its PCI address
    virtiofs   a virtiofs share's guest side: mounted by its tag, the tests' file in it
    volumes/   network volumes (AoE, iSCSI, NBD, NVMe/TCP, NFS): the registry, exports, attachments, credentials
"""
