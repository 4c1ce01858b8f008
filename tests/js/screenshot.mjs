// Headless Chromium (the system's, driven by playwright-core over CDP) opens a page, waits until
// its title is no longer "loading", and takes a screenshot of the viewport.
//   node screenshot.mjs CHROMIUM URL WIDTH HEIGHT OUT_DIR
// OUT_DIR/shot.png (as taken), OUT_DIR/shot.rgba (its pixels, decoded by pngjs, row by row) and
// OUT_DIR/shot.json: {"title", "width", "height", "console": [messages and page errors]}.
import { chromium } from "playwright-core";
import { PNG } from "pngjs";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

const [executablePath, url, width, height, out] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath,
  // (root gets no sandbox; containers have a small /dev/shm; sRGB at scale 1: one canvas pixel
  // is one screenshot pixel of the same colour)
  args: ["--no-sandbox", "--disable-dev-shm-usage", "--force-color-profile=srgb", "--disable-gpu"],
});
try {
  const page = await browser.newPage({ viewport: { width: Number(width), height: Number(height) }, deviceScaleFactor: 1 });
  const messages = [];
  page.on("console", (m) => messages.push(`${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => messages.push(`pageerror: ${e.message}`));
  await page.goto(url);
  await page.waitForFunction(() => document.title !== "loading", null, { timeout: 30000 });
  const title = await page.title();
  const png = await page.screenshot({ type: "png" });
  writeFileSync(join(out, "shot.png"), png);
  const img = PNG.sync.read(png);
  writeFileSync(join(out, "shot.rgba"), img.data);
  writeFileSync(join(out, "shot.json"), JSON.stringify({ title, width: img.width, height: img.height, console: messages }));
} finally {
  await browser.close();
}
