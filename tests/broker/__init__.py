"""A protocol-level Kafka test broker (tests only), modelled on how Apache Kafka answers.

It speaks the real wire protocol with the project's own codecs (:mod:`service.protocol`), so a client
under test talks to it over TCP exactly as to a broker. Pieces:

* :mod:`tests.broker.cluster` — :class:`TestCluster`, the entry point (brokers, topics, faults, log);
* :mod:`tests.broker.state` — cluster state without I/O (brokers, topics, partitions, leader epochs);
* :mod:`tests.broker.server` — one broker's listener and per-connection request loop;
* :mod:`tests.broker.registry` — the per-API handler registry and the handler context;
* :mod:`tests.broker.handlers` — handlers: ApiVersions, Metadata, SaslHandshake/SaslAuthenticate;
* :mod:`tests.broker.sasl_server` — credentials and the server side of PLAIN and SCRAM;
* :mod:`tests.broker.faults` — drop / delay / error injection;
* :mod:`tests.broker.log` — the request log.
"""

from tests.broker.cluster import BrokerHandlerError, TestCluster
from tests.broker.faults import Fault, FaultInjector
from tests.broker.handlers import default_registry
from tests.broker.log import RequestLog, RequestLogEntry
from tests.broker.registry import CloseConnection, HandlerRegistry, RequestContext
from tests.broker.server import BrokerServer, ClientConnection
from tests.broker.state import ClusterState, PartitionState, TopicState

__all__ = [
    "BrokerHandlerError",
    "BrokerServer",
    "ClientConnection",
    "CloseConnection",
    "ClusterState",
    "Fault",
    "FaultInjector",
    "HandlerRegistry",
    "PartitionState",
    "RequestContext",
    "RequestLog",
    "RequestLogEntry",
    "TestCluster",
    "TopicState",
    "default_registry",
]
