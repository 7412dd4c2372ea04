"""What runs a guest on this host; it imports spec and disks below it.

    accel         which accelerator guests get (KVM when it makes progress, else TCG; nested, Xen)
    daemons       reaching libvirt, starting virtlogd and libvirtd where systemd is not PID 1
    domain        a profile and a DomainPlan rendered into libvirt domain XML, and that XML read back
    guest         a benchmark guest: its transient domain and its agent; finding and destroying guests
    qga           the QEMU guest agent's protocol over a socket (Xen's libxl has no agent command)
    guestimage    the benchmark guest image (kernel, initramfs, manifest)
    launchtrace   where a guest's launch time goes, phase by phase
    xendom0       dom0's vCPUs and memory for a Xen run
    network       the host's side of a run's network: bridge, namespace, test servers, the guest's NIC, link checks
    placement     a profile's [placement] resolved on the host's CPUs and NUMA nodes, and read back from /proc
    hugepages     the host's huge pages reserved for a run and given back after it
    sriov         an SR-IOV NIC's virtual functions, made for a run and removed after it
    requirements  what this host must offer a profile's newer paths (CPUs, nodes, huge pages, devices)
"""
