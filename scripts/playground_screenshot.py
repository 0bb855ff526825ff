"""Screenshot of the playground (docs/playground.png) taken in headless Chromium against a running server.

Sends one prompt with the page's own form, waits for the run to finish, moves the replay scrubber back to
part-way through the run (so the picture shows committed and masked cells side by side) and saves the page.
Also holds the Chromium launch settings that tests/test_playground.py uses.

Usage: bash scripts/serve.sh &   # or any running dllm-serve
       python scripts/playground_screenshot.py [--url http://localhost:3000] [--out docs/playground.png]
       [--prompt "Count from 3 to 8."] [--max-tokens 32] [--block-length 32] [--at 0.9] [--theme light]

Needs Playwright (the test extra) and the OS's Chromium (`apt-get install chromium`): Playwright's own
browser download is not used.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

# Headless, and nothing Chromium would fetch for itself (updates, sync, first-run pages, QUIC probes): the
# page must work air-gapped, and the tests check that it asks no host but the server.
CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The system Chromium (or Chrome) binary, if there is one."""
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


def launch_chromium(playwright, executable: str | None = None):
    """A headless browser with a fresh profile (Playwright makes a temporary one per launch)."""
    executable = executable or find_chromium()
    if executable is None:
        raise RuntimeError("no Chromium binary found: install the OS package (apt-get install chromium)")
    return playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)


def take(url: str, out: Path, prompt: str, max_tokens: int, block_length: int, at: float, theme: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 900}, color_scheme=theme)
            page.goto(f"{url.rstrip('/')}/playground")
            page.get_by_test_id("max_tokens").fill(str(max_tokens))
            page.get_by_test_id("block_length").fill(str(block_length))
            page.get_by_test_id("prompt").fill(prompt)
            page.get_by_test_id("send").click()
            page.wait_for_selector("[data-testid=status][data-state=done]", timeout=120_000)
            steps = int(page.get_by_test_id("scrub").get_attribute("max"))
            scrub = page.get_by_test_id("scrub")
            scrub.focus()
            for _ in range(steps - round(steps * at)):
                page.keyboard.press("ArrowLeft")
            page.screenshot(path=str(out))
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://localhost:3000")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "playground.png")
    parser.add_argument("--prompt", default="Count from 3 to 8.")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--block-length", type=int, default=32)
    parser.add_argument("--at", type=float, default=0.9, help="where to leave the scrubber, 0-1 of the run")
    parser.add_argument("--theme", choices=("light", "dark"), default="light")
    args = parser.parse_args()
    take(args.url, args.out, args.prompt, args.max_tokens, args.block_length, args.at, args.theme)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
