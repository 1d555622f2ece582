// Why this exists: `npm run view` writes the live view's assets where crates/web embeds them.

import { mkdirSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { ASSETS_DIR, viewAssets } from "./build.js";

const assets = await viewAssets();
mkdirSync(ASSETS_DIR, { recursive: true });
for (const old of readdirSync(ASSETS_DIR)) if (!assets.has(old)) rmSync(`${ASSETS_DIR}${old}`);
for (const [name, bytes] of assets) {
  writeFileSync(`${ASSETS_DIR}${name}`, bytes);
  console.log(`wrote ${name} (${bytes.length} bytes)`);
}
