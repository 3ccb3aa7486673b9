"""The controller (issue [12]): elects a master per broker group and keeps its epochs and SyncStateSet.

``state`` is the replicated state machine (pure), ``events`` its log entries, ``elect`` the election policy,
``heartbeats`` the per-node liveness table and ``log`` the consensus interface with the single-node ``LocalLog``;
``config`` reads controller.properties (its ACL, TLS and the credentials it signs its notifications to brokers with).
"""
