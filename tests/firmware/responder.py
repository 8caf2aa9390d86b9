#!/usr/bin/env python3
"""Loopback MQTT 3.1.1 responder for the firmware smoke test, and the check of what it recorded.

`serve` listens on 127.0.0.1, accepts the connection QEMU opens for the board's UART
(`-serial tcp:127.0.0.1:PORT`), answers CONNACK, SUBACK, PUBACK and PINGRESP, and records every
PUBLISH as a JSON line. It can cut the first connection without a PUBACK (a broker crash in the
middle of a QoS 1 exchange), can send a QoS 1 command once enough readings arrived and cut the
connection when the device's reply to it comes, unacknowledged (a gateway losing power right
after the device applied the command: the device must resend the reply on its next connection),
and sends `halt` on the device's command topic once enough readings arrived (and that reply
was cut), so the firmware ends QEMU itself. `check` decodes the recorded readings (version byte + postcard, the layout
pinned by tern-shared's golden-bytes test) and fails unless the sequence numbers run 0, 1, 2, ...
without a gap, and unless the expected reply was recorded. It only ever binds loopback and stops
by itself.
"""

import argparse
import json
import socket
import sys
import time

CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK = 1, 2, 3, 4, 8, 9
PINGREQ, PINGRESP, DISCONNECT = 12, 13, 14
READING_VERSION = 1


class Closed(Exception):
    """The peer closed the connection."""


def read_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise Closed()
        data += chunk
    return data


def read_packet(conn):
    first = read_exact(conn, 1)[0]
    length, shift = 0, 0
    for _ in range(4):
        byte = read_exact(conn, 1)[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if byte & 0x80 == 0:
            break
    else:
        raise ValueError("malformed remaining length")
    return first >> 4, first & 0x0F, read_exact(conn, length)


def encode_publish(topic, payload, packet_id=None):
    """A PUBLISH at QoS 0, or at QoS 1 with `packet_id`."""
    body = len(topic).to_bytes(2, "big") + topic.encode()
    qos_flags = 0
    if packet_id is not None:
        body += packet_id.to_bytes(2, "big")
        qos_flags = 2
    body += payload
    assert len(body) < 128
    return bytes([PUBLISH << 4 | qos_flags, len(body)]) + body


def varint(data, pos):
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte & 0x80 == 0:
            return value, pos


def decode_reading(payload):
    """Decodes a version-1 reading: version byte, then postcard varints in field order."""
    if not payload or payload[0] != READING_VERSION:
        raise ValueError(f"unsupported reading version in {payload.hex()}")
    pos, fields = 1, []
    for _ in range(7):
        value, pos = varint(payload, pos)
        fields.append(value)
    if pos != len(payload):
        raise ValueError(f"{len(payload) - pos} trailing bytes in {payload.hex()}")
    device_id, sequence, uptime_ms, dropped, temp_zz, humidity, supply = fields
    temperature = (temp_zz >> 1) ^ -(temp_zz & 1)
    return {
        "device_id": device_id,
        "sequence": sequence,
        "uptime_ms": uptime_ms,
        "dropped": dropped,
        "temperature_centi_c": temperature,
        "humidity_centi_pct": humidity,
        "supply_mv": supply,
    }


def serve_connection(conn, args, state, record):
    """Handles one connection until it closes; returns True once `halt` was sent and acked."""
    while True:
        kind, flags, body = read_packet(conn)
        if kind != CONNECT and not state["session"]:
            # Like a real broker: a connection must open with CONNECT (a resend that reaches a
            # fresh connection is a protocol error, and the device has to reconnect properly).
            state["rejected"] += 1
            return False
        if kind == CONNECT:
            state["session"] = True
            state["connections"] += 1
            conn.sendall(bytes([CONNACK << 4, 2, 0, 0]))
        elif kind == SUBSCRIBE:
            conn.sendall(bytes([SUBACK << 4, 3]) + body[:2] + bytes([1]))
            state["command_topic"] = body[4 : 4 + int.from_bytes(body[2:4], "big")].decode()
        elif kind == PINGREQ:
            conn.sendall(bytes([PINGRESP << 4, 0]))
        elif kind == DISCONNECT:
            return state["halted"]
        elif kind == PUBACK:
            pass
        elif kind == PUBLISH:
            qos = (flags >> 1) & 3
            topic_len = int.from_bytes(body[:2], "big")
            topic = body[2 : 2 + topic_len].decode()
            rest = body[2 + topic_len :]
            packet_id = int.from_bytes(rest[:2], "big") if qos else None
            payload = rest[2:] if qos else rest
            state["publishes"] += 1
            if state["connections"] == 1 and state["publishes"] == args.drop_after:
                # A broker crash mid-exchange: the reading was never acknowledged.
                state["session"] = False
                conn.close()
                return False
            is_reply = topic.endswith("/reply")
            if is_reply and not state["reply_cut"]:
                # A power cut right after the device applied the command: its reply was never
                # acknowledged, and the command (acknowledged) will not come again.
                state["reply_cut"] = True
                state["session"] = False
                conn.close()
                return False
            record.write(
                json.dumps(
                    {
                        "topic": topic,
                        "dup": bool(flags & 8),
                        "qos": qos,
                        "connection": state["connections"],
                        "payload": payload.hex(),
                    }
                )
                + "\n"
            )
            record.flush()
            if packet_id is not None:
                conn.sendall(bytes([PUBACK << 4, 2]) + packet_id.to_bytes(2, "big"))
            if is_reply:
                continue
            state["acked"] += 1
            command_due = args.period_command and state["acked"] >= args.command_after
            if command_due and not state["commanded"]:
                command = args.period_command.encode()
                conn.sendall(encode_publish(state["command_topic"], command, packet_id=1))
                state["commanded"] = True
            # The command slot keeps only the newest command: `halt` waits until the device
            # answered the period command (its reply was cut), or it could replace it unread.
            answered = state["reply_cut"] or not args.period_command
            if state["acked"] >= args.halt_after and answered and not state["halted"]:
                conn.sendall(encode_publish(state["command_topic"], b"halt"))
                state["halted"] = True


def serve(args):
    deadline = time.monotonic() + args.timeout
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    with open(args.port_file, "w") as port_file:
        port_file.write(f"{listener.getsockname()[1]}\n")
    state = {
        "connections": 0,
        "publishes": 0,
        "acked": 0,
        "halted": False,
        "command_topic": "",
        "commanded": False,
        "reply_cut": False,
        "session": False,
        "rejected": 0,
    }
    with open(args.record, "w") as record:
        while time.monotonic() < deadline:
            listener.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                break
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                if serve_connection(conn, args, state, record):
                    print(
                        f"responder: halted after {state['acked']} readings over "
                        f"{state['connections']} connections "
                        f"({state['rejected']} rejected without CONNECT)",
                        file=sys.stderr,
                    )
                    return 0
            except (Closed, socket.timeout, ConnectionError):
                pass
            finally:
                state["session"] = False
                conn.close()
    print(f"responder: timed out after {state['acked']} readings", file=sys.stderr)
    return 1


def check(args):
    sequences, devices, dups, replies = [], set(), 0, []
    with open(args.record) as record:
        for line in record:
            entry = json.loads(line)
            if entry["topic"] == f"sensors/{args.device_id}/reply":
                replies.append(bytes.fromhex(entry["payload"]).decode(errors="replace"))
                continue
            reading = decode_reading(bytes.fromhex(entry["payload"]))
            expected_topic = f"sensors/{reading['device_id']}/reading"
            if entry["topic"] != expected_topic:
                raise SystemExit(f"reading on {entry['topic']}, expected {expected_topic}")
            if reading["dropped"] != 0:
                raise SystemExit(f"device dropped readings: {reading}")
            devices.add(reading["device_id"])
            dups += entry["dup"]
            if sequences and reading["sequence"] == sequences[-1]:
                continue  # a resend of a reading whose PUBACK was lost: at least once
            sequences.append(reading["sequence"])
    if devices != {args.device_id}:
        raise SystemExit(f"readings from devices {devices}, expected {{{args.device_id}}}")
    if len(sequences) < args.min_readings:
        raise SystemExit(f"only {len(sequences)} readings, expected at least {args.min_readings}")
    if sequences != list(range(len(sequences))):
        raise SystemExit(f"sequence numbers not consecutive from 0: {sequences}")
    if args.reply and args.reply not in replies:
        raise SystemExit(f"no reply {args.reply!r} after the cut that took the first one: {replies}")
    print(
        f"{len(sequences)} readings from device {args.device_id}, sequence 0..{sequences[-1]}, "
        f"no gap; replies {replies}"
    )
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port-file", required=True)
    s.add_argument("--record", required=True)
    s.add_argument("--drop-after", type=int, default=0, help="cut the first connection at this PUBLISH")
    s.add_argument("--halt-after", type=int, default=20, help="send halt after this many readings")
    s.add_argument("--period-command", default="", help="a QoS 1 command whose first reply is cut")
    s.add_argument("--command-after", type=int, default=0, help="send it after this many readings")
    s.add_argument("--timeout", type=float, default=60.0)
    c = sub.add_parser("check")
    c.add_argument("--record", required=True)
    c.add_argument("--device-id", type=int, required=True)
    c.add_argument("--min-readings", type=int, default=1)
    c.add_argument("--reply", default="", help="a reply the device must have published")
    args = parser.parse_args()
    return serve(args) if args.command == "serve" else check(args)


if __name__ == "__main__":
    sys.exit(main())
