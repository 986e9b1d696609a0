"""The Protobuf test schema of the consume and produce tests: ``{p}/order.proto`` (an ``Order`` with a total of
type ``{p}.money.Money``) importing ``{p}/money.proto``, built as descriptors (no protoc at test time)."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, message_factory
from google.protobuf.descriptor_pool import DescriptorPool

F = descriptor_pb2.FieldDescriptorProto


def order_files(p: str, *, ping_first: bool = False, with_note: bool = False
                ) -> tuple[descriptor_pb2.FileDescriptorProto, descriptor_pb2.FileDescriptorProto]:
    """(money.proto, order.proto) of package ``p``; ``ping_first`` puts a ``Ping`` message before ``Order``
    (so that Order's message index is 1, not 0); ``with_note`` adds a third field to Order (its next version)."""
    dep = descriptor_pb2.FileDescriptorProto(name=f"{p}/money.proto", package=f"{p}.money", syntax="proto3")
    money = dep.message_type.add(name="Money")
    money.field.add(name="units", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    money.field.add(name="currency", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    main = descriptor_pb2.FileDescriptorProto(name=f"{p}/order.proto", package=p, syntax="proto3",
                                              dependency=[f"{p}/money.proto"])
    if ping_first:
        ping = main.message_type.add(name="Ping")
        ping.field.add(name="n", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    order = main.message_type.add(name="Order")
    order.field.add(name="order_id", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    order.field.add(name="total", number=2, type=F.TYPE_MESSAGE, type_name=f".{p}.money.Money",
                    label=F.LABEL_OPTIONAL)
    if with_note:
        order.field.add(name="note", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    return dep, main


def order_class(p: str, *, ping_first: bool = False, with_note: bool = False) -> Any:
    """The generated message class of ``{p}.Order``."""
    pool = DescriptorPool()
    for f in order_files(p, ping_first=ping_first, with_note=with_note):
        pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{p}.Order"))
