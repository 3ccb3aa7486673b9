"""Access control for both protocols: RocketMQ's ACL 1.0 model (``plain_acl.yml``: accounts with access and secret
keys, topic and group permissions, admin rights, address allow-lists), checked at one place per server.

Layer: above net (it wraps a server's handler table and signs a client's requests) and protocol (codes, the
signature), below broker, namesrv and grpc, which turn it on. ``model`` and ``yamlite`` are pure; ``control`` holds
the ACL in force and checks attempts; ``remoting`` and ``admin`` are the remoting side; the gRPC endpoint builds
its attempts from the 5.x ``Authorization`` header (cometmq.grpc.rpc). See docs/security.md.
"""

from cometmq.acl.control import AccessControl, AccessDenied, Attempt, accounts_config, host_of
from cometmq.acl.model import Account, AclConfig, AclConfigError, AddressPattern, parse_acl
from cometmq.acl.policy import BROKER_POLICY, CONTROLLER_POLICY, NAMESRV_POLICY, Need, Policy

__all__ = ["BROKER_POLICY", "CONTROLLER_POLICY", "NAMESRV_POLICY", "AccessControl", "AccessDenied", "Account",
           "AclConfig", "AclConfigError", "AddressPattern", "Attempt", "Need", "Policy", "accounts_config", "host_of",
           "parse_acl"]
