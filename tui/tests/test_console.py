"""The guest serial console's tail (cloudbox.core.guest.read_console_tail): what a run's abort reason quotes when
its guest died. Captured-style input: kernel messages with CRLF, ANSI colours, a carriage-return progress line."""

from __future__ import annotations

from cloudbox.core.guest import read_console_tail


def test_tail_keeps_the_last_lines_as_text(tmp_path):
    log = tmp_path / "console.log"
    body = "".join(f"[    {i}.000000] line {i}\r\n" for i in range(40))
    log.write_bytes(
        body.encode()
        + b"\x1b[1;31mKernel panic - not syncing: Attempted to kill init! exitcode=0x00000100\x1b[0m\r\n"
        + b"progress 10%\rprogress 100%\r\n"
        + b"\r\n\r\n"
        + b"bad byte \xff here\x07\r\n"
    )
    tail = read_console_tail(log, 5)
    assert tail == [
        "[    38.000000] line 38",
        "[    39.000000] line 39",
        "Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100",
        "progress 100%",
        "bad byte \ufffd here",
    ]
    assert len(read_console_tail(log, 20)) == 20


def test_tail_of_missing_or_empty_log(tmp_path):
    assert read_console_tail(tmp_path / "nope.log") == []
    (tmp_path / "empty.log").write_bytes(b"")
    assert read_console_tail(tmp_path / "empty.log") == []
    (tmp_path / "blank.log").write_bytes(b"\r\n\n  \n")
    assert read_console_tail(tmp_path / "blank.log") == []


def test_tail_reads_only_the_end_of_a_big_log(tmp_path):
    log = tmp_path / "console.log"
    log.write_bytes(b"x" * 1_000_000 + b"\nlast line\n")
    assert read_console_tail(log, 1, max_bytes=4096) == ["last line"]
