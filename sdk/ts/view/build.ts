// Why this exists: one definition of the live view's assets (the bundled page script, its
// HTML and CSS, uPlot's CSS), used both to write them into crates/web/assets (`npm run view`)
// and by the test that fails when the committed assets differ from a fresh build.

import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

/** The package root (sdk/ts), from dist/view/ or view/. */
const root = fileURLToPath(new URL(import.meta.url.includes("/dist/") ? "../../" : "../", import.meta.url));

/** Where the Rust crate embeds them from. */
export const ASSETS_DIR = `${root}../../crates/web/assets/`;

/** Every asset by file name, as the gateway serves it. */
export async function viewAssets(): Promise<Map<string, Uint8Array>> {
  const out = await build({
    entryPoints: [`${root}view/main.ts`],
    bundle: true,
    minify: true,
    format: "esm",
    platform: "browser",
    target: "es2022",
    write: false,
    legalComments: "none",
    logLevel: "silent",
  });
  const script = out.outputFiles[0];
  if (!script) throw new Error("esbuild wrote nothing");
  return new Map<string, Uint8Array>([
    ["view.js", script.contents],
    ["index.html", bytes(`${root}view/index.html`)],
    ["style.css", bytes(`${root}view/style.css`)],
    ["uPlot.min.css", bytes(`${root}node_modules/uplot/dist/uPlot.min.css`)],
  ]);
}

const bytes = (path: string): Uint8Array => new Uint8Array(readFileSync(path));
