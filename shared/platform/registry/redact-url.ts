// Database URLs as they may be logged or shown: the password removed wherever it is written,
// `user:password@host` and `?password=…` (libpq's query parameters, sslpassword too).

export function redactDatabaseUrl(url: string): string {
  return url
    .replace(/\/\/([^:@/?#]*):[^@/?#]*@/, "//$1:***@")
    .replace(/([?&](?:ssl)?password=)[^&#]*/gi, "$1***");
}
