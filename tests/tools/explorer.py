"""Opens eeane's /docs in headless Chromium (Debian's, driven by Playwright)
the way a user would: waits for the operations and schemas to render, types
the API key under "Authorize", opens POST /v1/embeddings, presses "Try it out"
and "Execute", and reads the status the page shows. Takes a screenshot.

    python tests/tools/explorer.py URL KEY SCREENSHOT.png

Prints one JSON line: {"operations": [...], "schemas": [...], "status": "200",
"vectors": N, "foreign_requests": [...]} (requests to any other host than the
server's: the page must load nothing from elsewhere).
"""
import faulthandler
import json
import sys
from urllib.parse import urlparse

from playwright.sync_api import sync_playwright

url, key, screenshot = sys.argv[1], sys.argv[2], sys.argv[3]
host = urlparse(url).netloc

# Some Playwright calls (new_page, close) wait without a limit: a browser that
# stops answering would hang the test run. Past 100 s every thread's stack goes
# to stderr and the process exits, so the test fails saying where it stood.
faulthandler.dump_traceback_later(100, exit=True)

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"], timeout=60_000)
    page = browser.new_page(viewport={"width": 1400, "height": 2200})
    foreign = []
    page.on("request", lambda r: urlparse(r.url).netloc != host and not r.url.startswith("data:") and foreign.append(r.url))
    page.goto(f"{url}/docs/")
    page.wait_for_selector(".opblock-summary-path", timeout=30_000)
    operations = sorted({f"{e.get_attribute('data-path')}" for e in page.query_selector_all(".opblock-summary-path")})
    if "is-open" not in (page.get_attribute("section.models", "class") or ""):
        page.click("section.models .models-control")
    title = 'section.models article[data-json-schema-level="0"] > .json-schema-2020-12-head .json-schema-2020-12__title'
    page.wait_for_selector(title, timeout=10_000)
    schemas = sorted({e.inner_text().strip() for e in page.query_selector_all(title)})

    page.click("button.authorize")
    page.fill(".auth-container input", key)
    page.click(".auth-btn-wrapper button.authorize")
    page.click(".auth-btn-wrapper button.btn-done")

    operation = page.locator(".opblock-post", has=page.locator('.opblock-summary-path[data-path="/v1/embeddings"]'))
    operation.locator(".opblock-summary").first.click()
    # tryItOutEnabled opens an operation ready to send; otherwise press "Try it out".
    start = operation.locator("button.try-out__btn:not(.cancel)")
    if start.count():
        start.click()
    operation.locator("textarea.body-param__text").fill(json.dumps({"input": ["hello", "world"], "model": "all-minilm-l6-v2"}))
    operation.locator("button.execute").click()
    status_cell = operation.locator(".live-responses-table .response .response-col_status").first
    status_cell.wait_for(timeout=30_000)
    status = status_cell.inner_text().strip()
    body = operation.locator(".live-responses-table .response-col_description pre.microlight").first.inner_text()
    answer = json.loads(body)
    vectors = len(answer.get("data", []))
    page.screenshot(path=screenshot, full_page=False)
    # The findings are out before the browser closes: a browser that hangs on
    # its way out is then told apart from a page that did not work.
    print(json.dumps({"operations": operations, "schemas": schemas, "status": status, "vectors": vectors, "answer": answer if not vectors else None, "foreign_requests": foreign}), flush=True)
    # From here a hang is the browser's way out; the test's deadline ends it.
    faulthandler.cancel_dump_traceback_later()
    browser.close()
