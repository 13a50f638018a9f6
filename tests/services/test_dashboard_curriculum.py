"""The dashboard's curriculum cards in headless Chromium, over a control plane serving a PCL run's records: the
realised effective ratio against the uniform counterfactual, V's expectation and the gain, one point per step; V's
reliability diagram, a point per filled bin of each set; the pool V scored, a bar per filled bin, with the selected
band drawn at tau +- its width; and a run without V says so rather than drawing nothing. Skipped, with the reason,
where Chromium or selenium is missing (`make test` installs them)."""

from __future__ import annotations

import pytest

from pcl.strategies.prompt_curriculum import PCLStrategy
from services.control.api import create_app
from services.control.run import RunControl
from services.control.server import ControlServer
from tests.services.control_fixtures import CURRICULUM, TOKEN, step_record, store  # noqa: F401 - fixtures

pytestmark = pytest.mark.redis


def page_of(store, records: list[dict]):  # noqa: F811 - fixture
    """A control plane serving `records` (published as the coordinator publishes them) and a browser on its page."""
    from tests.services.test_control_live import _chromium

    control = RunControl(store, steps_total=10, poll_s=0.02)
    control.at_step_boundary(0, PCLStrategy(m=4, n=4, tau=0.5, k=2))
    for record in records:
        control.publish(record, record["step"])
    server = ControlServer(create_app(store, TOKEN), "127.0.0.1", 0).start()
    browser = _chromium(logging=True)
    return control, server, browser


def drawn(browser, step: int) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 60).until(lambda b: b.execute_script("return document.body.dataset.drawnStep") == str(step))


def points(browser, selector: str) -> int:
    return int(browser.execute_script(f"return document.querySelector('{selector} svg').dataset.points"))


def test_the_curriculum_cards_draw_the_gain_the_reliability_and_the_pool(store):  # noqa: F811 - fixture
    records = [step_record(step, tau=0.5) for step in (1, 2, 3)]
    records[-1]["curriculum_gain"] = 0.25
    control, server, browser = page_of(store, records)
    try:
        browser.get(f"{server.url}/")
        drawn(browser, 3)
        assert points(browser, '[data-plot="gain"]') == 3
        gain = browser.execute_script("return document.querySelector('[data-plot=\"gain\"] h2 span').textContent")
        assert "gain 0.25" in gain and "uniform (probe) 0.3" in gain and "V expected 0.9" in gain
        assert points(browser, '[data-picture="reliability"]') == 2 + 1  # the probe's 2 filled bins, trained's 1
        radii = browser.execute_script("return [...document.querySelectorAll('[data-picture=\"reliability\"] circle')]"
                                       ".map((c) => +c.getAttribute('r'))")
        assert len(radii) == 3 and max(radii) == pytest.approx(9.0)  # the trained set's only bin: all its prompts
        assert points(browser, '[data-picture="pool"]') == len(CURRICULUM["pool_histogram"])
        # the band's rectangle spans tau +- 0.15 on the V axis, the same scale as the bars of 0.1 of V each
        band, bar = browser.execute_script(
            "const rects = [...document.querySelectorAll('[data-picture=\"pool\"] rect')];"
            "return [+rects[0].getAttribute('width'), +rects[1].getAttribute('width')]")
        assert band == pytest.approx(3 * (bar + 2), rel=0.02)  # a bar is its bin's width less 2 px
        title = browser.execute_script("return document.querySelector('[data-picture=\"pool\"] h2 span').textContent")
        assert "8 candidates" in title and "band ±0.15" in title
        errors = [e["message"] for e in browser.get_log("browser")
                  if e["level"] == "SEVERE" and "favicon.ico" not in e["message"]]  # the page has no icon
        assert not errors, errors  # no script error, no Content-Security-Policy violation
    finally:
        browser.quit()
        server.stop()
        control.finish(3)


def test_a_run_without_v_says_so_in_the_curriculum_cards(store):  # noqa: F811 - fixture
    without_v = [{key: value for key, value in step_record(step).items() if key not in CURRICULUM} for step in (1, 2)]
    control, server, browser = page_of(store, without_v)
    try:
        browser.get(f"{server.url}/")
        drawn(browser, 2)
        for card in ('[data-picture="reliability"]', '[data-picture="pool"]'):
            assert points(browser, card) == 0
            text = browser.execute_script(f"return document.querySelector('{card} svg').textContent")
            assert text == "no V's predictions in this run yet", card
        assert points(browser, '[data-plot="gain"]') == 2  # the realised effective ratio alone
    finally:
        browser.quit()
        server.stop()
        control.finish(2)
