"""Authenticode signatures of EFI binaries (PE files), for tests/image/boot.bats' Secure Boot tests. Standard library
and the openssl command only: it runs with the test host's python3.

    efi_sig.py signers FILE     one line per signature: the issuer of its signing certificate, e.g.
                                "Microsoft Corporation UEFI CA 2011"; nothing (status 0) when FILE is unsigned
    efi_sig.py strip IN OUT     OUT is IN without its signatures (the certificate table dropped): an unsigned
                                binary that is otherwise the same
    efi_sig.py cert FILE CN     the certificate (PEM) whose subject's CN is CN among those FILE's signatures carry,
                                e.g. a CA's, to enrol in a test firmware's db; status 1 when there is none
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys
from pathlib import Path

CERT_TABLE = 4  # IMAGE_DIRECTORY_ENTRY_SECURITY: its "address" is a file offset


def _cert_table_entry(data: bytes) -> int:
    """The file offset of the PE optional header's certificate table entry (offset, size)."""
    if data[:2] != b"MZ":
        raise ValueError("not a PE file (no MZ header)")
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    if data[pe:pe + 4] != b"PE\0\0":
        raise ValueError("not a PE file (no PE signature)")
    opt = pe + 24
    magic = struct.unpack_from("<H", data, opt)[0]
    dirs = opt + (96 if magic == 0x10B else 112)  # PE32 or PE32+
    return dirs + 8 * CERT_TABLE


def signatures(data: bytes) -> list[bytes]:
    """The PKCS#7 blobs of the certificate table (WIN_CERTIFICATE entries, each 8-byte aligned)."""
    off, size = struct.unpack_from("<II", data, _cert_table_entry(data))
    out, pos = [], off
    while size and pos < off + size:
        length, _rev, kind = struct.unpack_from("<IHH", data, pos)
        if length < 8:
            break
        if kind == 2:  # WIN_CERT_TYPE_PKCS_SIGNED_DATA
            out.append(data[pos + 8:pos + length])
        pos += (length + 7) // 8 * 8
    return out


def signer_issuer(pkcs7: bytes) -> str:
    """The issuer CN of the certificate that made this signature: of the chain the signature carries, the certificate
    that issued no other (openssl lists the chain, not which one signed)."""
    r = subprocess.run(["openssl", "pkcs7", "-inform", "DER", "-print_certs", "-noout"], input=pkcs7,
                       capture_output=True, check=True)

    def cn(name: str) -> str:
        m = re.search(r"CN\s*=\s*([^,/]+)", name)
        return m.group(1).strip() if m else name.strip()

    certs = [(cn(s), cn(i)) for s, i in re.findall(r"subject=(.*)\n\s*issuer=(.*)", r.stdout.decode())]
    issuers = {i for _, i in certs}
    leaves = [i for s, i in certs if s not in issuers]
    return (leaves or [i for _, i in certs] or ["?"])[0]


def cert(data: bytes, name: str) -> str | None:
    """The PEM certificate with subject CN `name` from the chains the signatures carry, or None."""
    for sig in signatures(data):
        r = subprocess.run(["openssl", "pkcs7", "-inform", "DER", "-print_certs"], input=sig, capture_output=True,
                           check=True)
        for block in re.findall(r"subject=.*?-----END CERTIFICATE-----\n", r.stdout.decode(), re.S):
            m = re.match(r"subject=.*CN\s*=\s*([^,/\n]+)", block)
            if m and m.group(1).strip() == name:
                return block[block.index("-----BEGIN"):]
    return None


def strip(src: Path, dst: Path) -> None:
    data = bytearray(src.read_bytes())
    entry = _cert_table_entry(bytes(data))
    off, size = struct.unpack_from("<II", data, entry)
    if size:
        struct.pack_into("<II", data, entry, 0, 0)
        del data[off:off + size]
    dst.write_bytes(bytes(data))


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "signers":
        for sig in signatures(Path(argv[1]).read_bytes()):
            print(signer_issuer(sig))
        return 0
    if len(argv) == 3 and argv[0] == "cert":
        pem = cert(Path(argv[1]).read_bytes(), argv[2])
        if pem is None:
            print(f"no certificate with CN {argv[2]!r} in the signatures of {argv[1]}", file=sys.stderr)
            return 1
        print(pem, end="")
        return 0
    if len(argv) == 3 and argv[0] == "strip":
        strip(Path(argv[1]), Path(argv[2]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
