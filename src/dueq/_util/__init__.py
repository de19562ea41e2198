"""Internal: small parts every layer uses: the clock, argument checks, the worker's identity,
outage detection and backoff, and OpenTelemetry tracing."""
