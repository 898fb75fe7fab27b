"""The MPI launcher's way through jump hosts: its ssh runs this as its ``ProxyCommand``
(``python -S _relay.py SOCKET HOST PORT``), which asks the head's relay (a Unix socket only its
user can open) for a tunnel to HOST:PORT over the head's own connection to the jump host, then
copies bytes between that tunnel and ssh's standard input and output.

Plain standard library, run with ``-S``: it starts in a few milliseconds, once per ssh.
"""

import os
import select
import socket
import sys


def main(argv: list[str]) -> int:
    path, host, port = argv[1], argv[2], argv[3]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as relay:
        try:
            relay.connect(path)
        except OSError as exc:
            sys.stderr.write(f"clusterbook relay {path}: {exc.strerror or exc}\n")
            return 255
        relay.sendall(f"{host} {port}\n".encode())
        answer = b""
        while not answer.endswith(b"\n"):
            got = relay.recv(1)
            if not got:
                sys.stderr.write(f"clusterbook relay: no tunnel to {host}:{port}\n")
                return 255
            answer += got
        if answer != b"ok\n":
            sys.stderr.write(f"clusterbook relay: {answer.decode(errors='replace').strip()}\n")
            return 255
        return pump(relay, sys.stdin.fileno(), sys.stdout.fileno())


def pump(relay: socket.socket, stdin: int, stdout: int) -> int:
    """Copy bytes between ``relay`` and the files ``stdin`` and ``stdout`` until ``relay``
    ends (an end of ``stdin`` is passed on, and what ``relay`` still sends read)."""
    reading: list[socket.socket | int] = [relay, stdin]
    while reading:
        ready, _, _ = select.select(reading, [], [])
        for source in ready:
            if source is relay:
                data = relay.recv(65536)
                if not data:
                    return 0  # the far end closed: ssh sees its end of input
                _write_all(stdout, data)
            else:
                data = os.read(stdin, 65536)
                if not data:
                    relay.shutdown(socket.SHUT_WR)
                    reading.remove(stdin)
                else:
                    relay.sendall(data)
    return 0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


if __name__ == "__main__":
    sys.exit(main(sys.argv))
