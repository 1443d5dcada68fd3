// A dependency-free SVG heatmap for a square layer-by-layer matrix (values in [0, 1]).

export interface HeatmapOptions {
  title: string;
  subtitle?: string;
  rowLabel: string;
  colLabel: string;
  cell?: number;
}

const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

/** White (0) to dark blue (1). */
function colour(v: number): string {
  const t = Math.min(1, Math.max(0, Number.isFinite(v) ? v : 0));
  const mix = (a: number, b: number) => Math.round(a + (b - a) * t);
  return `rgb(${mix(255, 8)},${mix(255, 48)},${mix(255, 107)})`;
}

export function renderHeatmap(m: number[][], o: HeatmapOptions): string {
  const n = m.length,
    cell = o.cell ?? 16,
    left = 60,
    top = 60,
    size = n * cell;
  const w = left + size + 90,
    h = top + size + 50;
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" font-family="DejaVu Sans, sans-serif" font-size="11">`,
    `<rect width="${w}" height="${h}" fill="white"/>`,
    `<text x="${left}" y="20" font-size="14" font-weight="bold">${esc(o.title)}</text>`,
  ];
  if (o.subtitle) parts.push(`<text x="${left}" y="38" fill="#555">${esc(o.subtitle)}</text>`);
  for (let i = 0; i < n; i++)
    for (let j = 0; j < n; j++)
      parts.push(`<rect x="${left + j * cell}" y="${top + i * cell}" width="${cell}" height="${cell}" fill="${colour(m[i]![j]!)}"/>`);
  for (let i = 0; i < n; i += n > 16 ? 2 : 1) {
    parts.push(`<text x="${left - 4}" y="${top + i * cell + cell * 0.75}" text-anchor="end">${i}</text>`);
    parts.push(`<text x="${left + i * cell + cell / 2}" y="${top + size + 14}" text-anchor="middle">${i}</text>`);
  }
  parts.push(`<text x="${left + size / 2}" y="${top + size + 32}" text-anchor="middle">${esc(o.colLabel)}</text>`);
  parts.push(`<text transform="translate(16,${top + size / 2}) rotate(-90)" text-anchor="middle">${esc(o.rowLabel)}</text>`);
  // Colour scale.
  const sx = left + size + 20;
  for (let k = 0; k <= 20; k++)
    parts.push(
      `<rect x="${sx}" y="${top + size - (k + 1) * (size / 21)}" width="14" height="${size / 21 + 0.5}" fill="${colour(k / 20)}"/>`,
    );
  parts.push(`<text x="${sx + 18}" y="${top + 8}">1</text><text x="${sx + 18}" y="${top + size}">0</text>`);
  parts.push("</svg>");
  return parts.join("\n");
}
