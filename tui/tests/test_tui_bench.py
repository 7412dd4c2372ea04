"""The instrument of `make bench` (section "tui", cloudbox.tui.bench) on fixed data: it finds the frame that answers
each key through public Textual API, so a Textual upgrade that changes what it relies on fails here, not first in a
benchmark run with a real guest."""

from __future__ import annotations

import pytest
from test_tui_pilot import facts

from cloudbox.tui import bench, create_app
from cloudbox.tui.backend import Backend


@pytest.fixture
def backend(state) -> Backend:
    b = Backend(facts=facts(), libvirt_uri="test:///default")
    yield b
    b.close()


async def test_every_key_is_timed_by_the_frame_that_answers_it(backend):
    res = await bench.measure(create_app(backend, mode="overview", poll_interval=3600), presses=7)
    frames = res["frames"]
    assert len(frames["switch"]) == 8, frames
    assert len(frames["cursor"]) == len(frames["detail"]) == 10, frames
    assert len(res["idle"]["switch"]) == 8 and len(res["idle"]["cursor"]) == 10
    for kind, times in frames.items():
        assert all(0 < t < bench.FRAME_TIMEOUT_S * 1000 for t in times), (kind, times)
    # the idle time of a key includes its frames
    assert all(f <= i for f, i in zip(frames["switch"], res["idle"]["switch"], strict=True))
    assert all(max(c, d) <= i for c, d, i in zip(frames["cursor"], frames["detail"], res["idle"]["cursor"],
                                                  strict=True))
    assert bench.summary(res)[0].startswith("screen switch, frame: median ")


async def test_a_frame_that_does_not_show_the_answer_is_not_counted(backend, monkeypatch):
    """A key whose answer never comes (r reloads the Overview; it does not show Results) times out, naming what
    no frame showed: frames of another screen do not count."""
    monkeypatch.setattr(bench, "FRAME_TIMEOUT_S", 1.0)
    app = create_app(backend, mode="overview", poll_interval=3600)
    timer = bench.KeyTimer(app)

    async with app.run_test(headless=False, size=bench.SIZE) as pilot:
        for key, mode in (("5", "results"), ("1", "overview")):
            assert (await timer.press(pilot, key, bench.switch_shows(mode)))["switch"] > 0
        with pytest.raises(RuntimeError, match=r"key 'r': no frame showed '\[5 Results\]' within 1 s"):
            await timer.press(pilot, "r", bench.switch_shows("results"))
