// Why this exists: the README's picture of the live view, reproducible. With a demo running
// (`tickwire demo --scenario spatial --bots 200`), `npm run screenshot -- URL FILE [SECONDS]`
// opens URL in headless Chromium ($CHROMIUM or /usr/bin/chromium), waits until the map shows
// characters and the charts have SECONDS (default 20) of history, and saves a PNG.

import puppeteer from "puppeteer-core";

const [url = "http://127.0.0.1:7480/", file = "live-view.png", seconds = "20"] = process.argv.slice(2);
const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 800 });
  await page.goto(url, { waitUntil: "load" });
  await page.waitForFunction(() => Number(document.getElementById("characters")?.textContent) > 0, { timeout: 60_000 });
  await new Promise((r) => setTimeout(r, Number(seconds) * 1000));
  await page.screenshot({ path: file });
  const shown = await page.$eval("#characters", (e) => e.textContent);
  console.log(`wrote ${file}: ${shown} characters on the map`);
} finally {
  await browser.close();
}
