"""Views over stored runs and this box; it imports run and everything below it.

    compare    the studies' comparison tables over stored runs, and their renderings
    host       what this box is and has, for the overview
    readiness  whether this box is ready: virtualization, IOMMU, Secure Boot, each disk and NIC, read-only
"""
