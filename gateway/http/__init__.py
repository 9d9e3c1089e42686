"""The HTTP edge: routes, auth, byte ranges, conditional requests, listings and errors."""
