"""Drives the work strip in a real Chromium (Debian's) with Playwright.

Usage: strip.py SCENARIO URL [OUT]. The environment names the bgwork binary
(BGWORK_BIN) and the home of the daemon under test (BGWORK_HOME); the browser is
BGWORK_TEST_CHROMIUM (default /usr/bin/chromium). Prints one JSON object on its last
line: what the scenario saw, for the Rust test to judge. Any failure raises.
"""

import json
import os
import subprocess
import sys
import time

from playwright.sync_api import sync_playwright

BIN = os.environ["BGWORK_BIN"]
CHROMIUM = os.environ.get("BGWORK_TEST_CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium tries hosts this closed network refuses.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def cli(*args):
    """Runs the bgwork CLI; returns its stdout (raises on failure)."""
    done = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"bgwork {' '.join(args)}: {done.returncode} {done.stderr}")
    return done.stdout


def start(*args):
    return json.loads(cli("--json", "start", *args))["id"]


def opened(playwright, url, size=(1400, 800)):
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
    page = browser.new_context(viewport={"width": size[0], "height": size[1]}).new_page()
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(url)
    page.wait_for_selector("#conn.live", timeout=10_000)
    return browser, page, dialogs


def row(page, id_):
    return page.locator(f'.row[data-id="{id_}"]')


def appears(page, url):
    """A job started from the CLI appears; its output streams in as it prints."""
    gate = os.path.join(os.environ["BGWORK_HOME"], "gate")
    began = time.monotonic()
    id_ = start("--window", "0", "--", f"echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo second")
    row(page, id_).wait_for(timeout=1000)
    appear_ms = (time.monotonic() - began) * 1000
    row(page, id_).click()
    page.locator("#output", has_text="first").wait_for(timeout=5000)
    began = time.monotonic()
    open(gate, "w").close()
    page.locator("#output", has_text="second").wait_for(timeout=5000)
    stream_ms = (time.monotonic() - began) * 1000
    page.locator("#output .marker", has_text="finished successfully").wait_for(timeout=5000)
    return {"id": id_, "appear_ms": appear_ms, "stream_ms": stream_ms}


def thousand(page, url):
    """With a thousand items listed, a new one still shows within a second."""
    page.locator('#filters button[data-filter="all"]').click()
    page.locator(".row").nth(199).wait_for(timeout=10_000)
    rows = page.locator(".row").count()
    more = page.locator("#more").inner_text()
    began = time.monotonic()
    id_ = start("--window", "0", "--", "sleep 600")
    row(page, id_).wait_for(timeout=1000)
    appear_ms = (time.monotonic() - began) * 1000
    cli("stop", id_)
    return {"rows": rows, "more": more, "appear_ms": appear_ms}


def stop(page, url):
    """Stop on the page ends the job as the person."""
    id_ = start("--notify", "--", "sleep 600")
    row(page, id_).wait_for(timeout=5000)
    row(page, id_).locator('button[data-act="stop"]').click()
    page.locator(f'.row[data-id="{id_}"]').wait_for(state="detached", timeout=10_000)
    return {"id": id_}


def pane(page, url):
    """A pane's screen shows python's prompt; a line typed in the page is answered."""
    id_ = start("--pty", "--", "python3 -i -q")
    row(page, id_).wait_for(timeout=5000)
    row(page, id_).click()
    page.locator("#screen", has_text=">>>").wait_for(timeout=10_000)
    page.fill('form.keys input[name="text"]', "print(6 * 7, 'a\\\\b')")
    page.press('form.keys input[name="text"]', "Enter")
    page.locator("#screen", has_text="42 a\\b").wait_for(timeout=10_000)
    screen = page.locator("#screen").inner_text()
    page.locator('#detail button[data-act="close"]').click()
    return {"id": id_, "screen": screen}


def escapes(page, url):
    """Markup a job prints stays text; its colours become colour."""
    page.locator('#filters button[data-filter="all"]').click()
    id_ = start("--", "printf '<script>alert(1)</script>\\n<img src=x onerror=alert(2)>\\n\\033[31mred\\033[0m plain\\n'")
    row(page, id_).wait_for(timeout=5000)
    row(page, id_).click()
    page.locator("#output .marker", has_text="finished").wait_for(timeout=5000)
    text = page.locator("#output").inner_text()
    red = page.locator("#output span", has_text="red").first.evaluate("e => getComputedStyle(e).color")
    scripts = page.locator("#output script, #output img").count()
    return {"id": id_, "text": text, "red": red, "elements": scripts}


def stray(page, url):
    """Text after an ESC that starts no escape shows while the job waits; an escape cut
    at the end of what was printed so far is not shown."""
    id_ = start("--window", "0", "--",
                "printf 'stray \\033 then the text\\n\\033]0;a title never ended\\nthe line after\\ncut \\033[3'; sleep 600")
    row(page, id_).click()
    page.locator("#output", has_text="the line after").wait_for(timeout=5000)
    text = page.locator("#output").inner_text()
    cli("stop", id_)
    return {"id": id_, "text": text}


def hide(page, hidden):
    """Puts a tab in the background (or back): what the browser tells a page then."""
    page.evaluate(
        """hidden => {
            Object.defineProperty(document, 'hidden', { configurable: true, get: () => hidden });
            Object.defineProperty(document, 'visibilityState',
                { configurable: true, get: () => (hidden ? 'hidden' : 'visible') });
            document.dispatchEvent(new Event('visibilitychange'));
        }""",
        hidden,
    )


def tabs(page, url):
    """Tabs left open in the background do not take the browser's six connections to
    the strip: a fourth and a fifth tab load and follow, and a tab brought back goes on
    where it stopped."""
    gate = os.path.join(os.environ["BGWORK_HOME"], "gate")
    ids = [
        start("--window", "0", "--", f"echo tab {n}; while [ ! -e {gate} ]; do sleep 0.05; done; echo after the gate; sleep 600")
        for n in range(5)
    ]
    pages = [page] + [page.context.new_page() for _ in range(4)]
    for n, tab in enumerate(pages):
        if n > 0:
            tab.goto(url, timeout=10_000)
            tab.wait_for_selector("#conn.live", timeout=10_000)
        row(tab, ids[n]).click()
        tab.locator("#output", has_text=f"tab {n}").wait_for(timeout=10_000)
        if n < 3:
            hide(tab, True)
    open(gate, "w").close()
    for n in (3, 4):
        pages[n].locator("#output", has_text="after the gate").wait_for(timeout=10_000)
    hide(pages[0], False)
    pages[0].wait_for_selector("#conn.live", timeout=10_000)
    pages[0].locator("#output", has_text="after the gate").wait_for(timeout=10_000)
    first = pages[0].locator("#output").inner_text()
    for id_ in ids:
        cli("stop", id_)
    return {"ids": ids, "first": first}


def sessions(page, url):
    """A sub-agent's work is shown right under its parent's session, even when another
    session's name sorts between them ("app-2" before "app/sub-1" byte by byte)."""
    env = dict(os.environ)

    def as_session(name, *args):
        done = subprocess.run([BIN, "--json", *args], capture_output=True, text=True,
                              timeout=60, env={**env, "BGWORK_SESSION": name})
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        return json.loads(done.stdout)["id"]

    ids = [
        as_session("app", "start", "--", "sleep 600"),
        as_session("app-2", "start", "--", "sleep 600"),
        # The sub-agent starts work of its own, filed under app/sub-1.
        as_session("app", "agent", "start", "--", f"'{BIN}' start -- sleep 600; sleep 600"),
    ]
    page.locator("#groups h3").nth(2).wait_for(timeout=5000)
    heads = page.locator("#groups h3").all_inner_texts()
    for name, id_ in [("app/sub-1", "bg-1"), ("app", ids[0]), ("app-2", ids[1]), ("app", ids[2])]:
        as_session(name, "stop", id_)
    return {"heads": heads}


def counts(page, url):
    """Waiting items are counted apart from running ones, as `status` counts them (the
    summary and the chart's bar of this minute)."""
    ids = [start("--window", "0", "--", "sleep 600") for _ in range(3)]
    ids += [start("--after", ids[0], "--", "true") for _ in range(5)]
    row(page, ids[-1]).wait_for(timeout=10_000)
    page.wait_for_function(
        "document.querySelectorAll('.row').length >= 8", timeout=10_000)
    summary = page.locator("#summary").inner_text()
    bar = page.locator("#chart rect title").last.text_content()
    status = json.loads(cli("--json", "status"))
    for id_ in reversed(ids):
        cli("stop", id_)
    return {"summary": summary, "bar": bar, "status": status}


def failures(page, url):
    """The default tab shows running work and the runs that failed; the notices feed
    marks a failure; the chart is big enough to read."""
    bad = start("--", "echo broken; exit 3")
    fine = start("--", "echo fine")
    live = start("--window", "0", "--", "sleep 600")
    row(page, live).wait_for(timeout=5000)
    row(page, bad).wait_for(timeout=5000)
    tab = page.locator("#filters button.on").inner_text()
    shown = page.locator(".row").evaluate_all("rows => rows.map(r => r.dataset.id)")
    feed = page.locator(f'#feed li[data-id="{bad}"]')
    feed.wait_for(timeout=5000)
    failed_class = feed.get_attribute("class")
    failed_text = feed.inner_text()
    fine_class = page.locator(f'#feed li[data-id="{fine}"]').get_attribute("class")
    box = page.locator("#chart").bounding_box()
    labels = page.locator("#chart text").evaluate_all("texts => texts.map(t => t.textContent)")
    cli("stop", live)
    return {"ids": [bad, fine, live], "tab": tab, "shown": shown, "failed_class": failed_class,
            "failed_text": failed_text, "fine_class": fine_class, "chart": box, "labels": labels}


def screenshot(page, url, out):
    """The page with a few real jobs, for the README."""
    web = start("--name", "dev server", "--", "python3 -m http.server 0 --bind 127.0.0.1")
    tests = start(
        "--name",
        "tests",
        "--",
        "for t in parse lex eval print; do printf '\\033[32mPASS\\033[0m test_%s\\n' $t; sleep 0.2; done; "
        "printf '\\033[31mFAIL\\033[0m test_loop: expected 3, got 4\\n'; exit 1",
    )
    subprocess.run([BIN, "wait", tests], capture_output=True, timeout=60)
    build = start("--name", "watch build", "--", "for i in $(seq 1 40); do echo \"[$i/40] compiling unit_$i.rs\"; sleep 0.05; done; sleep 600")
    shell = start("--pty", "--name", "python", "--", "python3 -i -q")
    page.locator('#filters button[data-filter="all"]').click()
    row(page, shell).wait_for(timeout=5000)
    row(page, shell).click()
    page.locator("#screen", has_text=">>>").wait_for(timeout=10_000)
    page.fill('form.keys input[name="text"]', "sum(range(101))")
    page.press('form.keys input[name="text"]', "Enter")
    page.locator("#screen", has_text="5050").wait_for(timeout=10_000)
    row(page, build).click()
    page.locator("#output", has_text="[40/40]").wait_for(timeout=10_000)
    page.screenshot(path=out)
    for id_ in (web, build, shell):
        cli("stop", id_)
    return {"ids": [web, tests, build, shell], "out": out}


def main():
    scenario, url = sys.argv[1], sys.argv[2]
    with sync_playwright() as playwright:
        browser, page, dialogs = opened(playwright, url)
        try:
            if scenario == "screenshot":
                result = screenshot(page, url, sys.argv[3])
            else:
                result = globals()[scenario](page, url)
            result["dialogs"] = dialogs
        finally:
            browser.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
