"""Security of a deployment (docs/security.md).

``certs`` (per-cluster CAs), ``revocation`` (CRLs the brokers check), ``lifecycle``
(issue/rotate/revoke/list), ``roles`` (least-privilege broker permissions),
``keys`` + ``auth`` (per-job HMAC message tags, replay rules, AES-GCM sealing),
``data_access`` (owner-signed dataset grants), ``audit`` (hash-chained log) and
``broker_log`` (connection refusals from the brokers' logs into the audit log).
"""
