"""A TCP proxy in front of a server whose path a test cuts and restores: one
instance loses PostgreSQL while the others keep it."""

import re
import socket
import threading

from harness.common import free_port


class CuttableProxy:
    """A TCP proxy in front of PostgreSQL whose path can be cut (every connection closed, new
    ones refused) and restored on the same port."""

    def __init__(self, server):
        self.target = (server.host, server.port)
        self.port = free_port()
        self.conns = []
        self.lock = threading.Lock()
        self.listener = None
        self.restore()

    def restore(self):
        self.listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def server_ports(self):
        """The local ports of the connections to the server open now: its sessions' client_port
        in pg_stat_activity."""
        ports = []
        with self.lock:
            for c in self.conns[1::2]:
                try:
                    ports.append(c.getsockname()[1])
                except OSError:
                    pass  # closed already: its session ended
        return ports

    def cut(self):
        # close() alone does not wake a thread blocked in accept(), which would go on accepting
        # on the closed socket; shutdown() does (accept fails with EINVAL).
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        with self.lock:
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
            self.conns = []

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()  # the server is down: so is the path
                continue
            with self.lock:
                self.conns += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def conninfo(self, conninfo):
        """conninfo (key=value) with its host and port replaced by the proxy's."""
        return re.sub(r"port=\d+", f"port={self.port}",
                      re.sub(r"host=\S+", "host=127.0.0.1", conninfo))
