// Database URLs as they may be logged or shown: the password removed wherever it is written,
// `user:password@host` and `?password=…` (libpq's query parameters, sslpassword too). A password
// may hold an unencoded `@`, `/`, `?` or `#`, so the credentials run from the first `:` after the
// scheme to the last `@` of the URL: more is hidden when in doubt, never less.

export function redactDatabaseUrl(url: string): string {
  let out = url;
  const start = out.indexOf("://");
  const at = out.lastIndexOf("@");
  if (start >= 0 && at > start) {
    const colon = out.indexOf(":", start + 3);
    if (colon >= 0 && colon < at) out = `${out.slice(0, colon + 1)}***${out.slice(at)}`;
  }
  return out.replace(/([?&](?:ssl)?password=)[^&#]*/gi, "$1***");
}
