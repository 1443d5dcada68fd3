// SVG to PNG with resvg (system fonts: DejaVu on Debian), for charts people open as images.
import { Resvg } from "@resvg/resvg-js";

import { writeFileAtomic } from "./json.ts";

export async function writeSvgAndPng(svgPath: string, svg: string): Promise<void> {
  await writeFileAtomic(svgPath, svg);
  const png = new Resvg(svg, { font: { loadSystemFonts: true, defaultFontFamily: "DejaVu Sans" } }).render().asPng();
  await writeFileAtomic(svgPath.replace(/\.svg$/, ".png"), png);
}
