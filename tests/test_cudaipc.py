"""CUDA IPC between groups of one machine (`distributed.cudaipc`), on the CPU's strict fakes.

The routing is checked against `fake_cudaipc.FakeIpc` on `fake_cuda.FakeRuntime`:
the producer's stream, events, handles and the consumer's stream are fakes
that raise where a GPU would read stale or freed memory. The tests marked
``cuda`` make the real round trip between two processes on a GPU.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
from typing import Any

import msgpack
import pytest
import torch

from mujou_actors.devices import DeviceMessage
from mujou_actors.distributed import cudaipc, dataplane, wire
from mujou_actors.errors import WireError
from tests.fake_cuda import FakeCudaTensor, FakeRuntime, StaleRead, shadow
from tests.fake_cudaipc import FakeIpc

CUDA0 = torch.device("cuda", 0)
DECLARED = [object]


def _sent(rt: FakeRuntime, value: Any, stream: Any) -> DeviceMessage:
    """A device-path message: ``value`` on cuda:0, written on ``stream``, its ready event."""
    with rt.use(stream):
        message = rt.cuda(value)
    event = rt.new_event()
    rt.record(event, stream)
    return DeviceMessage(message, CUDA0, event)


class Ends:
    """A producer's and a consumer's end of one link, each with its own streams."""

    def __init__(self, rt: FakeRuntime, **bounds: Any) -> None:
        self.rt = rt
        self.ipc = FakeIpc(rt)
        self.sender = rt.new_stream(CUDA0)  # the sending node's stream
        self.reader = rt.new_stream(CUDA0)  # the consumer's data-plane stream
        self.encoder = wire.Encoder()
        self.exporter = self.encoder.shared = cudaipc.Exporter(self.ipc, **bounds)
        self.decoder = wire.Decoder()
        self.importer = self.decoder.shared = cudaipc.Importer(self.ipc)

    def cross(self, items: list[Any], shared: int | None = None) -> tuple[list[Any], list[Any],
                                                                         list[Any]]:
        """Encode on the producer's thread, carry as the header does, decode on the consumer's."""
        items = self.exporter.prepare(items, len(items) if shared is None else shared)
        frames = self.encoder.encode(items, DECLARED)
        rows = msgpack.unpackb(msgpack.packb(self.encoder.take_shared()))
        with self.rt.use(self.reader):
            got = self.decoder.decode(frames, DECLARED, rows)
        return frames, rows, got


def _item(message: Any) -> tuple[int, int, int, int, Any]:
    return (5, 0, 1, 0, message)


def test_a_cuda_tensor_crosses_by_ipc_ordered_after_the_producer() -> None:
    rt = FakeRuntime()
    ends = Ends(rt)
    value = torch.arange(1024, dtype=torch.float32).reshape(32, 32)
    message = _sent(rt, {"x": value}, ends.sender)
    message.value.update(n=3, cpu=torch.ones(2))  # a CPU tensor beside: its bytes go
    frames, rows, got = ends.cross([_item(message)])
    # No tensor bytes of the CUDA tensor on the wire: only the CPU one's 8 bytes.
    assert sum(len(f) for f in frames[1:]) == 8
    assert len(rows) == 1
    index, eid, uuid, handle, size, _, _, _, _, _, offset, strides, nbytes, event = rows[0]
    assert (index, uuid, offset, strides, nbytes) == (0, b"GPU-fake-0", 0, [32, 1], 4096)
    assert type(handle) is bytes and type(event) is bytes and size >= nbytes
    received = got[0][4]
    assert got[0][:4] == (5, 0, 1, 0) and received["n"] == 3
    t = received["x"]
    assert isinstance(t, FakeCudaTensor) and t.device == CUDA0
    assert torch.equal(shadow(t), value)
    # The reader's own memory, not the producer's.
    assert t.shadow.data_ptr() != message.value["x"].shadow.data_ptr()
    assert t.is_contiguous()
    ipc = [e[1:] for e in rt.log if e[0] == "ipc"]
    kinds = [e[0] for e in ipc]
    # Producer: the interprocess event on its data-plane stream (which waited for the
    # sender's ready event), then the share; consumer: wait, open, copy, done event.
    assert kinds == ["ipc_event", "share", "event_from_handle", "open", "copy_on",
                     "done_event"]
    assert ("wait_event", "default@cuda:0", message.event.name) in rt.log
    ipc_event = ipc[0][1]
    assert ("wait_event", ends.reader.name, ipc_event) in rt.log
    assert rt.log.index(("wait_event", ends.reader.name, ipc_event)) < rt.log.index(
        ("ipc", "copy_on", ends.reader.name))
    assert ends.exporter.stats()["exported"] == 1 and ends.exporter.in_flight == 1


def test_the_consumer_reads_stale_memory_without_the_producers_event() -> None:
    # The fake's strictness, which the test above relies on: skip the wait and it fails.
    rt = FakeRuntime()
    ends = Ends(rt)
    message = _sent(rt, torch.ones(64), ends.sender)

    class NoWait(FakeIpc):
        def wait_event(self, stream: Any, event: Any) -> None:
            if stream is ends.reader:
                return
            super().wait_event(stream, event)

    ends.importer.rt = NoWait(rt)
    ends.importer.rt._memory = ends.ipc._memory  # type: ignore[attr-defined]
    ends.importer.rt._events = ends.ipc._events  # type: ignore[attr-defined]
    with pytest.raises(StaleRead):
        ends.cross([_item(message)])
    # A tensor whose producer did not wait for the sender's ready event is stale too.
    rt2 = FakeRuntime()
    ends2 = Ends(rt2)
    with rt2.use(ends2.sender):
        raw = rt2.cuda(torch.ones(64))
    with pytest.raises(StaleRead):
        ends2.cross([_item(raw)])


def test_release_comes_back_once_the_consumers_copy_is_done() -> None:
    rt = FakeRuntime()
    ends = Ends(rt)
    ends.cross([_item(_sent(rt, torch.ones(256), ends.sender))])
    assert ends.importer.take_released() == []  # the fake GPU has not copied yet
    assert ends.exporter.in_flight == 1
    rt.finish_all()
    released = ends.importer.take_released()
    assert len(released) == 1
    ends.exporter.release(released)
    assert ends.exporter.in_flight == 0 and ends.exporter.bytes_in_flight == 0
    assert ends.exporter.stats()["released"] == 1
    ends.exporter.release(released)  # again: ignored
    assert ends.exporter.stats()["released"] == 1


def test_the_producer_keeps_the_tensor_until_released() -> None:
    rt = FakeRuntime()
    ends = Ends(rt)
    message = _sent(rt, torch.ones(16), ends.sender)
    items = ends.exporter.prepare([_item(message)], 1)
    frames = ends.encoder.encode(items, DECLARED)
    rows = ends.encoder.take_shared()
    del message, items
    gc.collect()
    # The sender dropped its message; the exporter's reference keeps the memory valid.
    with rt.use(ends.reader):
        got = ends.decoder.decode(frames, DECLARED, rows)
    assert torch.equal(shadow(got[0][4]), torch.ones(16))
    # Once released, the fake frees it: a late open of that handle fails, as in CUDA.
    ends.exporter.release([rows[0][1]])
    gc.collect()
    with rt.use(ends.reader), pytest.raises(WireError, match="does not open"):
        ends.decoder.decode(frames, DECLARED, rows)


def test_in_flight_bound_falls_back_to_the_host_path(caplog: pytest.LogCaptureFixture) -> None:
    rt = FakeRuntime()
    ends = Ends(rt, max_in_flight=1)
    a, b = torch.full((128,), 1.0), torch.full((128,), 2.0)
    message = _sent(rt, [a, b], ends.sender)
    with caplog.at_level(logging.INFO, logger="mujou_actors.distributed.cudaipc"):
        frames, rows, got = ends.cross([_item(message)])
    assert len(rows) == 1 and rows[0][0] == 0  # the first by IPC
    assert sum(len(f) for f in frames[1:]) == 512  # the second's bytes inline
    first, second = got[0][4]
    assert first.device == CUDA0 and second.device.type == "cpu"
    assert torch.equal(shadow(first), a) and torch.equal(second, b)
    assert ends.exporter.stats()["fallbacks"] == {"bound": 1}
    assert any("host copy: bound" in r.getMessage() for r in caplog.records)
    # Released, the next batch goes by IPC again.
    rt.finish_all()
    ends.exporter.release(ends.importer.take_released())
    _, rows, _ = ends.cross([_item(_sent(rt, torch.ones(4), ends.sender))])
    assert len(rows) == 1


def test_byte_bound_and_unshareable_tensors_fall_back() -> None:
    rt = FakeRuntime()
    ends = Ends(rt, max_bytes=100)
    _, rows, got = ends.cross([_item(_sent(rt, torch.ones(64), ends.sender))])  # 256 bytes
    assert rows == [] and got[0][4].device.type == "cpu"
    assert torch.equal(got[0][4], torch.ones(64))
    ends.ipc.refuse_share = True
    ends.exporter.max_bytes = 1 << 20
    _, rows, got = ends.cross([_item(_sent(rt, torch.ones(8), ends.sender))])
    assert rows == [] and torch.equal(got[0][4], torch.ones(8))
    assert ends.exporter.stats()["fallbacks"] == {"bound": 1, "not shareable": 1}
    assert ends.exporter.in_flight == 0


def test_without_ipc_a_cuda_tensor_takes_the_host_path() -> None:
    rt = FakeRuntime()
    ipc = FakeIpc(rt, available=False)
    encoder = wire.Encoder()
    exporter = encoder.shared = cudaipc.Exporter(ipc)
    sender = rt.new_stream(CUDA0)
    items = exporter.prepare([_item(_sent(rt, torch.ones(8), sender))], 1)
    frames = encoder.encode(items, DECLARED)
    assert encoder.take_shared() == [] and exporter.stats()["fallbacks"] == {"unavailable": 1}
    got = wire.Decoder().decode(frames, DECLARED)
    assert torch.equal(got[0][4], torch.ones(8))


def test_another_machines_link_has_no_ipc() -> None:
    routes = dataplane.Routes([], {})
    with pytest.raises(ValueError, match="one machine"):
        dataplane.HostLink("tcp://127.0.0.1:0", routes, cuda_ipc=True)
    with pytest.raises(ValueError, match="one machine"):
        dataplane.GroupLink("tcp://127.0.0.1:1", routes, cuda_ipc=FakeIpc(FakeRuntime()))
    # And a decoder without CUDA IPC refuses descriptors rather than guess.
    rt = FakeRuntime()
    ends = Ends(rt)
    items = ends.exporter.prepare([_item(_sent(rt, torch.ones(8), ends.sender))], 1)
    frames = ends.encoder.encode(items, DECLARED)
    with pytest.raises(WireError, match="without CUDA IPC"):
        wire.Decoder().decode(frames, DECLARED, ends.encoder.take_shared())


def test_published_copies_go_to_the_host_on_the_cpu() -> None:
    rt = FakeRuntime()
    ends = Ends(rt)
    sent = _sent(rt, torch.ones(8), ends.sender)
    _, rows, got = ends.cross([_item(sent), _item(sent.value)], shared=1)
    assert len(rows) == 1 and rows[0][0] == 0
    assert got[0][4].device == CUDA0 and got[1][4].device.type == "cpu"
    assert torch.equal(got[1][4], torch.ones(8))


def test_the_host_relays_to_two_groups_and_releases_after_both() -> None:
    rt = FakeRuntime()
    ipc = FakeIpc(rt)
    sender = rt.new_stream(CUDA0)
    # Group A's end, the host's two ends (from A, to B and C), B's and C's ends.
    a_enc = wire.Encoder()
    a_exp = a_enc.shared = cudaipc.Exporter(ipc)
    h_dec = wire.Decoder()
    relay = h_dec.shared = cudaipc.Relay()
    to_b, to_c = wire.Encoder(), wire.Encoder()
    fwd_b = to_b.shared = cudaipc.Exporter(None)
    fwd_c = to_c.shared = cudaipc.Exporter(None)
    b_dec, c_dec = wire.Decoder(), wire.Decoder()
    b_imp = b_dec.shared = cudaipc.Importer(ipc)
    c_imp = c_dec.shared = cudaipc.Importer(ipc)
    value = torch.arange(50, dtype=torch.int64)

    items = a_exp.prepare([_item(_sent(rt, (value, "tag"), sender))], 1)
    frames = a_enc.encode(items, DECLARED)
    rows = msgpack.unpackb(msgpack.packb(a_enc.take_shared()))
    in_host = h_dec.decode(frames, DECLARED, rows)  # the host opens nothing
    placeholder = in_host[0][4][0]
    assert placeholder.device.type == "cpu" and not ipc.opened
    received = []
    for enc, dec in ((to_b, b_dec), (to_c, c_dec)):
        out = enc.encode(in_host, DECLARED)
        fwd = msgpack.unpackb(msgpack.packb(enc.take_shared()))
        assert len(fwd) == 1 and fwd[0][2:] == rows[0][2:] and fwd[0][1] != rows[0][1]
        assert sum(len(f) for f in out[1:]) == 0  # the placeholder's bytes never travel
        with rt.use(rt.new_stream(CUDA0)):
            got = dec.decode(out, DECLARED, fwd)
        received.append(got[0][4])
    for message in received:
        assert message[1] == "tag" and torch.equal(shadow(message[0]), value)
    assert len(ipc.opened) == 2
    del in_host, placeholder
    gc.collect()
    rt.finish_all()
    fwd_b.release(b_imp.take_released())
    assert relay.take_released() == []  # C still copies
    fwd_c.release(c_imp.take_released())
    back = relay.take_released()
    assert back == [rows[0][1]]
    a_exp.release(back)
    assert a_exp.in_flight == 0


def test_a_message_the_host_drops_is_released() -> None:
    # A reply of an abandoned grant (a restart) is decoded and dropped unread.
    rt = FakeRuntime()
    ends = Ends(rt)
    relay = ends.decoder.shared = cudaipc.Relay()
    items = ends.exporter.prepare([_item(_sent(rt, torch.ones(8), ends.sender))], 1)
    frames = ends.encoder.encode(items, DECLARED)
    rows = ends.encoder.take_shared()
    got = ends.decoder.decode(frames, DECLARED, rows)
    assert relay.take_released() == []
    del got
    gc.collect()
    ends.exporter.release(relay.take_released())
    assert ends.exporter.in_flight == 0


def test_a_message_dropped_by_the_readers_qos_is_released() -> None:
    # The consumer copies at decode, so the release does not wait for any read: a
    # message that a depth=1 Input replaces before it is read releases all the same.
    rt = FakeRuntime()
    ends = Ends(rt)
    for k in range(3):
        ends.cross([_item(_sent(rt, torch.full((4,), float(k)), ends.sender))])
    rt.finish_all()
    ends.exporter.release(ends.importer.take_released())
    assert ends.exporter.in_flight == 0 and ends.exporter.stats()["released"] == 3


def test_a_closed_link_releases_its_forwards() -> None:
    rt = FakeRuntime()
    ends = Ends(rt)
    relay = ends.decoder.shared = cudaipc.Relay()
    items = ends.exporter.prepare([_item(_sent(rt, torch.ones(8), ends.sender))], 1)
    frames = ends.encoder.encode(items, DECLARED)
    in_host = ends.decoder.decode(frames, DECLARED, ends.encoder.take_shared())
    to_dead = wire.Encoder()
    fwd = to_dead.shared = cudaipc.Exporter(None)
    to_dead.encode(in_host, DECLARED)
    to_dead.take_shared()
    del in_host
    gc.collect()
    assert relay.take_released() == []
    fwd.close()  # the consumer's group died: its link is closed
    ends.exporter.release(relay.take_released())
    assert ends.exporter.in_flight == 0


def test_a_device_the_consumer_does_not_see_is_an_error() -> None:
    rt = FakeRuntime()
    ends = Ends(rt)
    ends.importer.rt = FakeIpc(rt, visible=[1])
    with pytest.raises(WireError, match="does not see"):
        ends.cross([_item(_sent(rt, torch.ones(8), ends.sender))])


@pytest.mark.parametrize("damage", [
    lambda r: r[:5],
    lambda r: [*r[:12], -1, r[13]],
    lambda r: [*r[:3], b"x" * 300, *r[4:]],
    lambda r: [*r[:11], ["1"], *r[12:]],
    lambda r: [*r[:12], r[4] + 1, r[13]],
    lambda r: [7, *r[1:]],
])
def test_damaged_descriptors_are_wire_errors(damage: Any) -> None:
    rt = FakeRuntime()
    ends = Ends(rt)
    items = ends.exporter.prepare([_item(_sent(rt, torch.ones(8), ends.sender))], 1)
    frames = ends.encoder.encode(items, DECLARED)
    rows = [damage(list(ends.encoder.take_shared()[0]))]
    with rt.use(ends.reader), pytest.raises(WireError):
        ends.decoder.decode(frames, DECLARED, rows)


def test_too_many_descriptors_are_refused() -> None:
    with pytest.raises(WireError, match="at most"):
        cudaipc.check_rows([[]] * (cudaipc.MAX_ROWS + 1))
    with pytest.raises(WireError, match="not a list"):
        cudaipc.check_rows({"a": 1})


def test_swap_rebuilds_only_containers_that_hold_a_placeholder() -> None:
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    kept = [c]
    messages = [{"x": (a, 1), "y": kept}, b]
    out = cudaipc.swap(messages, {id(a): "A", id(b): "B"})
    assert out[0]["x"] == ("A", 1) and out[1] == "B" and out[0]["y"][0] is c


def test_exporter_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        cudaipc.Exporter(None, max_in_flight=0)
    with pytest.raises(ValueError):
        cudaipc.Exporter(None, max_bytes=0)


# -- a real GPU -----------------------------------------------------------------------------


def _consumer(conn: Any) -> None:
    """The consumer process: decode what comes, send back the values and the released ids."""
    decoder = wire.Decoder()
    rt = cudaipc.TorchIpc()
    importer = decoder.shared = cudaipc.Importer(rt)
    while True:
        got = conn.recv()
        if got is None:
            break
        frames, rows = got
        items = decoder.decode(frames, DECLARED, msgpack.unpackb(rows))
        t = items[0][4]
        torch.cuda.synchronize()
        importer_done = []
        while not importer_done:
            importer_done = importer.take_released()
        conn.send((str(t.device), t.is_contiguous(), t.cpu(), importer_done))
    importer.close()


@pytest.mark.cuda
def test_real_ipc_round_trip_between_two_processes() -> None:
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_consumer, args=(there,), daemon=True)
    child.start()
    try:
        encoder = wire.Encoder()
        exporter = encoder.shared = cudaipc.Exporter(cudaipc.TorchIpc())
        for k, make in enumerate((lambda: torch.randn(1 << 20, device="cuda"),
                                  lambda: torch.randn(64, 48, device="cuda").t(),
                                  lambda: torch.arange(100, device="cuda")[10:60:2],
                                  lambda: torch.randn(1, device="cuda").expand(300))):
            sent = make()
            items = exporter.prepare([_item(sent)], 1)
            frames = [bytes(f) for f in encoder.encode(items, DECLARED)]
            rows = encoder.take_shared()
            assert len(rows) == 1, exporter.stats()
            here.send((frames, msgpack.packb(rows)))
            device, contiguous, values, released = here.recv()
            assert device == "cuda:0" and contiguous
            assert torch.equal(values, sent.cpu()), k
            exporter.release(released)
            assert exporter.in_flight == 0
        here.send(None)
        child.join(60)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()


# -- the links: a group's reply through the host to another group, over real sockets --------


def test_links_carry_a_cuda_tensor_from_group_to_group_and_the_release_back(
        tmp_path: Any) -> None:
    import types

    rt = FakeRuntime()
    ipc = FakeIpc(rt)
    routes: Any = types.SimpleNamespace(declared=[object])
    host_a = dataplane.HostLink(f"ipc://{tmp_path}/a", routes, cuda_ipc=True)
    host_b = dataplane.HostLink(f"ipc://{tmp_path}/b", routes, cuda_ipc=True)
    group_a = dataplane.GroupLink(f"ipc://{tmp_path}/a", routes, cuda_ipc=ipc)
    group_b = dataplane.GroupLink(f"ipc://{tmp_path}/b", routes, cuda_ipc=ipc)
    links = (host_a, host_b, group_a, group_b)
    try:
        sender, reader = rt.new_stream(CUDA0), rt.new_stream(CUDA0)
        value = torch.arange(4096, dtype=torch.float32)
        message = _sent(rt, value, sender)
        host_a.send(dataplane.Grant(None))
        assert group_a.receive(5) is not None
        # A's reply: the message as a send, and the host's published copy of it.
        group_a.send(dataplane.Reply(None, 0, [_item(message)],
                                     published=[(0, 0, 0, 0, message)]))
        reply = host_a.receive(5)
        assert reply is not None
        placeholder = reply.sends[0][4]
        assert placeholder.device.type == "cpu" and hasattr(placeholder, "_mujou_shared")
        assert torch.equal(reply.published[0][4], value)  # the host's own copy: real bytes
        assert group_a.ipc_stats["exported"] == 1
        host_b.send(dataplane.Grant(None, messages=list(reply.sends)))
        del reply, placeholder
        gc.collect()
        with rt.use(reader):
            grant = group_b.receive(5)
        assert grant is not None
        got = grant.messages[0][4]
        assert got.device == CUDA0 and torch.equal(shadow(got), value)
        assert host_b.ipc_stats["forwarded"] == 1
        rt.finish_all()  # B's copy is done: its next reply gives the id back
        group_b.send(dataplane.Reply(None, 0, []))
        assert host_b.receive(5) is not None
        # The host let go of the placeholder and B gave the forward back: A's id goes
        # back with A's next grant.
        host_a.send(dataplane.Grant(None))
        assert group_a.receive(5) is not None
        assert group_a.ipc_stats["in_flight"] == 0 and group_a.ipc_stats["released"] == 1
    finally:
        for link in links:
            link.close()


# -- the group's kernel: what its outbox gets ---------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("outside_device", [True, False])
def test_a_groups_cuda_sender_keeps_outside_messages_on_the_device(
        outside_device: bool) -> None:
    from mujou_actors._runtime.build import Seams
    from mujou_actors._runtime.kernel import LAST_DELTA, Kernel
    from tests.fake_cuda import FakeWaiter
    from tests.test_devices import Reader, Sender, _on

    rt = FakeRuntime()
    sender = _on(Sender(rt), CUDA0)
    reader = Reader()
    import mujou_actors as mujou

    mujou.connect(sender.out, reader.inp)
    net = {"src": sender, "dst": reader}
    seams = Seams(cuda_runtime=lambda: rt,  # type: ignore[arg-type]
                  make_waiter=lambda sync: FakeWaiter(sync))  # type: ignore[arg-type]
    kernel = Kernel(net, ["src"], seams=seams, outside_device=outside_device)
    try:
        kernel.start()
        kernel.next_due()
        kernel.step(until=(10_000_000, LAST_DELTA))
        sends = kernel.take_sends()
    finally:
        kernel.stop()
    assert sends
    message = sends[0].message
    if outside_device:
        # The device path: the sender's clone with its ready event, for the link's Exporter.
        assert type(message) is DeviceMessage and message.value.device == CUDA0
        ipc = FakeIpc(rt)
        exporter = cudaipc.Exporter(ipc)
        items = exporter.prepare([(0, 0, 0, 0, message)], 1)
        assert hasattr(items[0][4], "_mujou_shared")
    else:  # the host path, as before
        assert type(message) is torch.Tensor and message.device.type == "cpu"


def test_the_hosts_own_group_opens_relayed_tensors_in_the_host() -> None:
    rt = FakeRuntime()
    ends = Ends(rt)
    relay = ends.decoder.shared = cudaipc.Relay()
    value = torch.arange(10.0)
    message = _sent(rt, {"v": value}, ends.sender)
    items = ends.exporter.prepare([_item(message)], 1)
    frames = ends.encoder.encode(items, DECLARED)
    in_host = ends.decoder.decode(frames, DECLARED, ends.encoder.take_shared())
    opener = cudaipc.LocalOpener(ends.ipc)
    with rt.use(ends.reader):
        opened = opener.open(in_host)
    got = opened[0][4]["v"]
    assert got.device == CUDA0 and torch.equal(shadow(got), value)
    del in_host, opened
    gc.collect()
    assert relay.take_released() == []  # its copy is not done yet
    rt.finish_all()
    opener.poll()
    ends.exporter.release(relay.take_released())
    assert ends.exporter.in_flight == 0


@pytest.mark.timeout(120)
def test_a_placed_run_with_cuda_ipc_on_runs_as_without(monkeypatch: pytest.MonkeyPatch) -> None:
    # On the CPU nothing is shared (CUDA IPC is unavailable), but every link carries the
    # two extra header entries and the host's own group has its opener: the run's
    # messages and state are those of one process, bit for bit.
    from tests.test_placed import assert_same_tree, placed_run, single

    monkeypatch.setenv("MUJOU_CUDA_IPC", "1")
    expected = single(0.1)
    run = placed_run({"sim": "a", "ctrl": "b"}, 0.1)
    links = {name: g.link for name, g in run._driver.groups.items()}
    assert all(link.ipc is not None for name, link in links.items() if name != "host")
    assert links["host"].opener is not None
    run.join(30)
    assert_same_tree(run.state_dict(), expected)
    groups = run.stats().groups  # each group's end says what it shared: nothing, here
    for name in ("a", "b"):
        figures = groups[name].cuda_ipc
        assert figures is not None and figures["exported"] == figures["in_flight"] == 0
        assert figures["fallbacks"] == {}  # no CUDA tensor crossed: nothing fell back
    assert groups["host"].cuda_ipc is None


def test_without_ipc_a_device_path_message_is_copied_to_the_host_after_its_event() -> None:
    # A group's CUDA sender with a reader on its device in the group and one in another
    # group hands its outbox a DeviceMessage, which the wire cannot encode as it is.
    rt = FakeRuntime()
    ipc = FakeIpc(rt)
    sender = rt.new_stream(CUDA0)
    message = _sent(rt, {"v": torch.arange(5.0)}, sender)
    with pytest.raises(TypeError, match="DeviceMessage"):
        wire.Encoder().encode([_item(message)], DECLARED)
    items = cudaipc.host_items([_item(message), _item(3)], ipc)
    assert ("wait_event", "default@cuda:0", message.event.name) in rt.log
    got = wire.Decoder().decode(wire.Encoder().encode(items, DECLARED), DECLARED)
    assert torch.equal(got[0][4]["v"], torch.arange(5.0)) and got[1][4] == 3
    # Without the wait, the copy reads the clone before the sender's stream wrote it.
    rt2 = FakeRuntime()
    stale = _sent(rt2, torch.ones(3), rt2.new_stream(CUDA0))

    class NoWait(FakeIpc):
        def wait_event(self, stream: Any, event: Any) -> None:
            pass

    with pytest.raises(StaleRead):
        cudaipc.host_items([_item(stale)], NoWait(rt2))


def test_a_group_without_cuda_nodes_gets_received_tensors_on_the_cpu() -> None:
    import types

    rt = FakeRuntime()
    ends = Ends(rt)
    cpu_only = [types.SimpleNamespace(device=torch.device("cpu"))]
    cudaipc.to_host_without_cuda(ends.importer, cpu_only)
    assert ends.importer.to_host
    _, rows, got = ends.cross([_item(_sent(rt, torch.arange(6.0), ends.sender))])
    assert len(rows) == 1  # shared all the same: the producer cannot know
    assert got[0][4].device.type == "cpu" and torch.equal(got[0][4], torch.arange(6.0))
    # After the device copy, on the same stream.
    kinds = [e[1] for e in rt.log if e[0] == "ipc"]
    assert kinds.index("to_cpu") > kinds.index("copy_on")
    cudaipc.to_host_without_cuda(ends.importer, [types.SimpleNamespace(device=CUDA0)])
    assert not ends.importer.to_host


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reader_device", [CUDA0, torch.device("cpu")])
def test_a_received_tensor_reaches_a_reader_of_the_kernel_ordered_and_on_its_device(
        reader_device: torch.device) -> None:
    # The group's data-plane thread decodes (the Importer's copy on its current stream)
    # and delivers into its kernel (Kernel.deliver's copy on that same stream, waited
    # for): the reader's hook reads on its own stream, and the strict fake raises
    # StaleRead if anything were out of order.
    import mujou_actors as mujou
    from mujou_actors._runtime.build import Seams
    from mujou_actors._runtime.kernel import LAST_DELTA, Kernel
    from tests.fake_cuda import FakeWaiter
    from tests.test_devices import Reader, Sender, _on

    rt = FakeRuntime()
    ends = Ends(rt)
    sender = _on(Sender(rt), CUDA0)
    reader = _on(Reader(rt), reader_device) if reader_device.type == "cuda" else Reader()
    extra = _on(Reader(rt), CUDA0)  # a CUDA node in the group: its kernel has a runtime
    mujou.connect(sender.out, reader.inp)
    net = {"src": sender, "dst": reader, "gpu": extra}
    seams = Seams(cuda_runtime=lambda: rt,  # type: ignore[arg-type]
                  make_waiter=lambda sync: FakeWaiter(sync))  # type: ignore[arg-type]
    kernel = Kernel(net, ["dst", "gpu"], seams=seams)
    value = torch.arange(3.0)
    try:
        kernel.start()
        items = ends.exporter.prepare([_item(_sent(rt, value, ends.sender))], 1)
        frames = ends.encoder.encode(items, DECLARED)
        got = ends.decoder.decode(frames, DECLARED, ends.encoder.take_shared())  # no stream
        kernel.deliver("dst.inp", got[0][4], 0, 0, 0)
        kernel.next_due()
        kernel.step(until=(10_000_000, LAST_DELTA))
    finally:
        kernel.stop()
    assert len(reader.got) == 1 and torch.equal(reader.got[0], value)


def test_an_expanded_and_a_transposed_tensor_cross_with_their_elements() -> None:
    rt = FakeRuntime()
    ends = Ends(rt)
    with rt.use(ends.sender):
        base = rt.cuda(torch.arange(12.0).reshape(3, 4))
        one = rt.cuda(torch.tensor([7.0]))
        # A message of views: a transpose and an expansion (stride 0).
        value = {"t": base.t(), "e": one.expand(5)}
    event = rt.new_event()
    rt.record(event, ends.sender)
    _, rows, got = ends.cross([_item(DeviceMessage(value, CUDA0, event))])
    assert len(rows) == 2
    t, e = got[0][4]["t"], got[0][4]["e"]
    assert t.is_contiguous() and torch.equal(shadow(t), torch.arange(12.0).reshape(3, 4).t())
    assert torch.equal(shadow(e), torch.full((5,), 7.0))
