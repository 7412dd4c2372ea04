"""Network block volumes served by this box (issue 15's first slice): the registry of volumes (`store`), this box's
TLS credentials (`pki`), an NBD export (`nbd`) and a volume exported for one run (`attach`). docs/volumes.md says
what works where."""
