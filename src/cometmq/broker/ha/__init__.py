"""Replication of a broker group: the HA link (master and replica sides), the SyncStateSet and the roles."""
