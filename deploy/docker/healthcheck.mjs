// The image's HEALTHCHECK: GET /health on this container's own port (the port the service reads:
// CTXBANK_PORT, then PORT, then 8080) and exit 0 only on a 200. Plain Node, no curl in the image.
const port = process.env.CTXBANK_PORT || process.env.PORT || "8080";
try {
  const res = await fetch(`http://127.0.0.1:${port}/health`, { signal: AbortSignal.timeout(2500) });
  process.exit(res.status === 200 ? 0 : 1);
} catch {
  process.exit(1);
}
