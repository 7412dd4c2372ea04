"""Network volumes served by this box or by the front-end, and attached by a host, a guest or QEMU.

    store       the volume registry (volumes.db): pre-allocated files or LVs
    lvm         LV-backed volumes
    attach      a volume for one run: checked, exported, described as the run's backing store, taken down
    transports  each scheme's part in a run, one class per scheme, and the VolumeExport a run holds
    aoe         an AoE export (vblade)
    iscsi       an iSCSI export with CHAP (tgtd), and its initiator in the guest
    nbd         an NBD export with TLS (qemu-nbd)
    nvmet       an NVMe/TCP export (the kernel's nvmet)
    nfs         an NFSv4 export of a directory (nfs-ganesha) and the mounts of it
    hostattach  the host's own kernel attaching a volume (open-iscsi, nbd-client, aoe, nvme-tcp)
    pki         this box's CA and certificates for NBD with TLS, and private writes of every credentials file
    nodecreds   a back-end's credentials for the front-end's volumes

docs/volumes.md says what works where, and docs/nfs.md the NFS path.
"""
