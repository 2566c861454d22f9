"""Security of a deployment: certificates (``certs``); later, rotation, revocation and audit."""
