"""A protocol-level Kafka test broker (tests only), modelled on how Apache Kafka answers.

It speaks the real wire protocol with the project's own codecs (:mod:`service.protocol`), so a client
under test talks to it over TCP exactly as to a broker. Pieces:

* :mod:`tests.fakes.broker.cluster` — :class:`TestCluster`, the entry point (brokers, topics, faults, log);
* :mod:`tests.fakes.broker.state` — cluster state without I/O (brokers, topics, partitions, leader epochs);
* :mod:`tests.fakes.broker.server` — one broker's listener and per-connection request loop;
* :mod:`tests.fakes.broker.registry` — the per-API handler registry and the handler context;
* :mod:`tests.fakes.broker.handlers` — handlers: ApiVersions, Metadata, SaslHandshake/SaslAuthenticate;
* :mod:`tests.fakes.broker.sasl_server` — credentials and the server side of PLAIN and SCRAM;
* :mod:`tests.fakes.broker.faults` — drop / delay / error injection;
* :mod:`tests.fakes.broker.log` — the request log.
"""

from tests.fakes.broker.cluster import BrokerHandlerError, TestCluster
from tests.fakes.broker.faults import Fault, FaultInjector
from tests.fakes.broker.handlers import default_registry
from tests.fakes.broker.log import RequestLog, RequestLogEntry
from tests.fakes.broker.registry import CloseConnection, HandlerRegistry, RequestContext
from tests.fakes.broker.server import BrokerServer, ClientConnection
from tests.fakes.broker.state import ClusterState, PartitionState, TopicState

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
