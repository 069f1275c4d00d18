"""Test hosts on one machine: a controller and N workers, each a network
namespace with its own PID namespace and hostname, wired into a bridge that
lives in a namespace of the test's own, so that Open MPI, fsdp-super and
fsdp-train meet real hosts: their own addresses, pids that mean nothing on
another host, links that can be cut, hosts that can die whole.

How a cluster is built (all names carry PREFIX, the test's pid and a
counter, so runs never collide and a crashed run's leftovers are found):

    ip netns add fmh-PID-K-net                     the switch
    ip -n fmh-PID-K-net link add br0 type bridge
    ip netns add fmh-PID-K-w1                      one per host
    ip -n fmh-PID-K-net link add w1 type veth peer name eth0 netns fmh-PID-K-w1
    ip -n fmh-PID-K-net link set w1 master br0 up
    ip -n fmh-PID-K-w1 addr add 10.213.77.11/24 dev eth0; lo and eth0 up
    sysctl net.ipv6.conf.{all,default,lo}.disable_ipv6=1 in every namespace
    ip netns exec fmh-PID-K-w1 unshare --pid --fork --mount-proc --uts \\
        --kill-child python3 hosts.py init HOSTNAME ADDRESS

The init (pid 1 of the host) sets the hostname, mounts the host's own
/dev/shm (a tmpfs that dies with it), starts the host's remote
shell server (rsh.py, on ADDRESS:7022) and reaps orphans. Commands from the
test enter a host through the init's namespaces (net, pid, uts, mount:
`hosts.py exec`), never through the network; Open MPI reaches a host only
through the network, with the launch agent mh-rsh.

A host can lose its link (partition: its port leaves the bridge, the host
sees nothing, packets vanish both ways) and can die (every process of its
PID namespace killed: node loss). Teardown kills everything, deletes every
namespace and checks that no process is left in any of them.

Only addresses of SUBNET, assigned inside these namespaces, are ever used:
no namespace has a default route, so nothing can leave the test network."""

import ctypes
import glob
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import harness  # noqa: E402
import rsh  # noqa: E402

PREFIX = "fmh-"
SUBNET = "10.213.77"  # .0/24; the controller is .2, worker i is .(10+i)
CIDR = f"{SUBNET}.0/24"
AGENT = os.path.join(HERE, "mh-rsh")
PY = "/usr/bin/python3"
NETNS_DIR = "/run/netns"
_counter = itertools.count(1)

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x4000000, 0x20000000, 0x40000000


def sh(args, check=True):
    """Runs a setup command in the root namespaces (ip, sysctl)."""
    p = subprocess.run(args, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {p.stderr.strip()}")
    return p


def ns_inode(pid, kind):
    """The inode of a process's namespace of a kind, or None if it is gone."""
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def processes_in(net=(), pid=(), uts=()):
    """[(pid, comm)] of every process in any of the given namespaces (inodes)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        p = int(entry)
        if (ns_inode(p, "net") in net or ns_inode(p, "pid") in pid
                or ns_inode(p, "uts") in uts):
            try:
                with open(f"/proc/{p}/stat") as f:
                    fields = f.read().rsplit(")", 1)
                if fields[1].split()[0] == "Z":
                    continue
                comm = fields[0].split("(", 1)[1]
            except (OSError, IndexError):
                continue
            found.append((p, comm))
    return found


def kill_until_gone(net=(), pid=(), uts=(), limit=10.0):
    """SIGKILLs every process in the namespaces until none is left; returns
    what is still there after `limit` seconds (empty when clean)."""
    deadline = time.monotonic() + limit
    while True:
        left = processes_in(net, pid, uts)
        if not left or time.monotonic() > deadline:
            return left
        for p, _ in left:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def unsupported():
    """Why test hosts cannot be built here, or None."""
    if os.geteuid() != 0:
        return "building test hosts needs root (network and PID namespaces)"
    for tool in ("ip", "unshare", "sysctl", "mpirun"):
        if not any(os.access(os.path.join(d, tool), os.X_OK)
                   for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin", "/sbin"]):
            return f"{tool} not found"
    return None


def clean_stale():
    """Removes what crashed earlier runs left (namespaces named PREFIX-PID-...
    whose PID no longer runs), with every process still inside them."""
    try:
        names = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return
    for name in names:
        m = re.match(re.escape(PREFIX) + r"(\d+)-", name)
        if not m or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        try:
            ino = os.stat(os.path.join(NETNS_DIR, name)).st_ino
        except OSError:
            continue
        kill_until_gone(net={ino})
        sh(["ip", "netns", "del", name], check=False)
    for path in glob.glob(f"/tmp/ompi.{PREFIX}*") + glob.glob(f"/dev/shm/vader_segment.{PREFIX}*"):
        m = re.search(re.escape(PREFIX) + r"(\d+)-", path)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _remove_session_files(os.path.basename(path).split(".")[1])


def _remove_session_files(hostname_glob):
    """Open MPI's per-host session directories and shared-memory segments:
    on real hosts they die with the host, here they would pile up in the
    shared /tmp and /dev/shm (killed daemons cannot remove their own)."""
    for pattern in (f"/tmp/ompi.{hostname_glob}.*", f"/dev/shm/vader_segment.{hostname_glob}.*"):
        for path in glob.glob(pattern):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def _ipv6_off(ns):
    sh(["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
        "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
        "net.ipv6.conf.lo.disable_ipv6=1"])


def _pdeathsig():
    """In a child before exec: die with the test (no orphaned hosts)."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# Site configuration every host shares (as /etc/environment would on a
# fleet): this machine pins OpenBLAS's kernel with OPENBLAS_CORETYPE, and a
# rank whose OpenBLAS picks another kernel computes different bits.
SITE_ENV = ("OPENBLAS_", "OMP_", "GOTO_")


def host_env(hostmap):
    """What a command started through the remote shell sees: a login-like
    environment, not the test's (as with ssh), plus the site configuration."""
    env = {k: v for k, v in os.environ.items() if k.startswith(SITE_ENV)}
    env.update({"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/sh",
                "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "FSDP_MH_HOSTMAP": hostmap})
    return env


class Host:
    """One test host: name ('c', 'w1', ...), hostname, netns, addr."""

    def __init__(self, cluster, name, addr):
        self.cluster, self.name, self.addr = cluster, name, addr
        self.ns = f"{cluster.id}-{name}"
        self.hostname = self.ns
        self.init = None       # the unshare process (root PID namespace)
        self.init_pid = None   # pid 1 of the host, as the root namespace sees it
        self.pidns = self.utsns = None
        self.login_env = {}    # more of the login environment (host_env), this host only
        self.netns = None

    # -- building
    def create(self):
        c = self.cluster
        sh(["ip", "netns", "add", self.ns])
        self.netns = os.stat(os.path.join(NETNS_DIR, self.ns)).st_ino
        _ipv6_off(self.ns)
        sh(["ip", "-n", c.net, "link", "add", self.name, "type", "veth",
            "peer", "name", "eth0", "netns", self.ns])
        sh(["ip", "-n", c.net, "link", "set", self.name, "master", "br0", "up"])
        sh(["ip", "-n", self.ns, "addr", "add", f"{self.addr}/24", "dev", "eth0"])
        sh(["ip", "-n", self.ns, "link", "set", "lo", "up"])
        sh(["ip", "-n", self.ns, "link", "set", "eth0", "up"])

    def start(self):
        """Boots the host: a new PID namespace whose init sets the hostname
        and runs the remote shell server. Also after kill_all (a node that
        comes back)."""
        assert not self.up(), f"{self.name} is already up"
        self.init = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "unshare", "--pid", "--fork", "--mount-proc",
             "--uts", "--kill-child", PY, os.path.join(HERE, "hosts.py"), "init",
             self.hostname, self.addr],
            env=dict(host_env(self.cluster.hostmap), **self.login_env), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=open(self.cluster.path(f"{self.name}.init.log"), "a"),
            preexec_fn=_pdeathsig)
        deadline = time.monotonic() + 10
        self.init_pid = None
        while self.init_pid is None:
            assert time.monotonic() < deadline, f"{self.name}: init did not start"
            try:
                with open(f"/proc/{self.init.pid}/task/{self.init.pid}/children") as f:
                    kids = f.read().split()
            except OSError:
                kids = []
            if kids and ns_inode(kids[0], "pid") != ns_inode(self.init.pid, "pid"):
                self.init_pid = int(kids[0])
            else:
                time.sleep(0.01)
        self.pidns = ns_inode(self.init_pid, "pid")
        self.utsns = ns_inode(self.init_pid, "uts")
        self.cluster.seen_pidns.add(self.pidns)
        self.cluster.seen_utsns.add(self.utsns)

    def up(self):
        return self.init_pid is not None and self.init.poll() is None

    # -- running things on the host (from the test, not through the network)
    def _argv(self, argv, cwd):
        assert self.up(), f"{self.name} is down"
        return [PY, os.path.join(HERE, "hosts.py"), "exec", str(self.init_pid),
                cwd or os.getcwd(), "--"] + list(argv)

    def popen(self, argv, env=None, cwd=None, **kw):
        """Starts argv inside the host (its net, pid, uts and mount
        namespaces) with env (default: harness.ENV); signals sent to the
        returned process are forwarded to it."""
        return subprocess.Popen(self._argv(argv, cwd), env=env or harness.ENV,
                                start_new_session=True, **kw)

    def run(self, argv, env=None, cwd=None, check=True, timeout=60, **kw):
        p = subprocess.run(self._argv(argv, cwd), env=env or harness.ENV, capture_output=True,
                           text=True, errors="replace", timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise AssertionError(f"{self.name}: {argv[0]} exited {p.returncode}:\n"
                                 f"{p.stderr[-3000:]}")
        return p

    # -- what runs there
    def pids(self):
        """[(pid, comm)] of every process of the host (root-namespace pids)."""
        return processes_in(pid={self.pidns}) if self.pidns else []

    def job_pids(self):
        """The host's processes other than its own init and shell server."""
        return [(p, comm) for p, comm in self.pids()
                if p != self.init_pid and not self._is_infra(p)]

    def _is_infra(self, pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            return False
        return (len(argv) > 2 and argv[1].endswith(b"rsh.py") and argv[2] == b"serve")

    def signal_all(self, sig):
        for p, _ in self.pids():
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass

    def kill_all(self, sig=signal.SIGKILL, limit=10.0):
        """Node loss: sig to every process of the host at once. With SIGKILL
        the host is down afterwards (its init is gone; start() boots it again)."""
        if not self.up():
            return
        if sig != signal.SIGKILL:
            self.signal_all(sig)
            return
        os.kill(self.init_pid, signal.SIGKILL)  # the kernel kills the whole PID namespace
        self.signal_all(sig)
        left = kill_until_gone(pid={self.pidns}, limit=limit)
        assert not left, f"{self.name}: processes survived SIGKILL: {left}"
        self.init.wait(timeout=limit)

    def power_off(self):
        """A node that vanishes without a word: the link goes first, so the
        dying processes' FIN and RST never leave (kill_all alone lets the
        kernel close their connections, which peers notice at once).
        link(True) and start() bring it back."""
        self.link(False)
        self.kill_all(signal.SIGKILL)

    def link(self, up):
        """up=False: partition. The host's port leaves the bridge; its own
        link stays up (no carrier change), packets to and from it vanish."""
        c = self.cluster
        if up:
            sh(["ip", "-n", c.net, "link", "set", self.name, "master", "br0"])
        else:
            sh(["ip", "-n", c.net, "link", "set", self.name, "nomaster"])


class Cluster:
    """A controller (cluster.controller, runs mpirun / fsdp-super, no ranks)
    and n_workers workers (cluster.workers). Use as a context manager, or call
    teardown() in a finally."""

    def __init__(self, n_workers, tmp, start=True, login_env=None):
        """login_env: {worker name: {variable: value}} added to what commands
        started through the remote shell on that worker see (what a
        host's own profile would set)."""
        assert 1 <= n_workers <= 8
        clean_stale()
        self.id = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.net = f"{self.id}-net"
        self.dir = os.path.join(tmp, "cluster")
        os.makedirs(self.dir, exist_ok=True)
        self.hostmap = self.path("hostmap")
        self.seen_pidns, self.seen_utsns = set(), set()
        self.controller = Host(self, "c", f"{SUBNET}.2")
        self.workers = [Host(self, f"w{i}", f"{SUBNET}.{10 + i}") for i in range(1, n_workers + 1)]
        self.hosts = [self.controller] + self.workers
        for h in self.hosts:
            h.login_env = dict((login_env or {}).get(h.name, {}))
        with open(self.hostmap, "w") as f:
            for h in self.hosts:
                f.write(f"{h.hostname} {h.addr}\n")
        self.torn_down = False
        try:
            self._build()
            if start:
                for h in self.hosts:
                    h.start()
                self.wait_reachable()
        except BaseException:
            self.teardown()
            raise

    def _build(self):
        sh(["ip", "netns", "add", self.net])
        self.netns = os.stat(os.path.join(NETNS_DIR, self.net)).st_ino
        _ipv6_off(self.net)
        sh(["ip", "-n", self.net, "link", "add", "br0", "type", "bridge"])
        sh(["ip", "-n", self.net, "link", "set", "br0", "up"])
        for h in self.hosts:
            h.create()

    def path(self, name):
        return os.path.join(self.dir, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.teardown()
        return False

    # -- network
    def agent(self, src, host, argv, timeout=30, **kw):
        """Runs argv on `host` through the launch agent started on `src`
        (over the test network, as Open MPI would)."""
        return src.run([AGENT, host.addr] + list(argv), env=host_env(self.hostmap),
                       check=False, timeout=timeout, **kw)

    def wait_reachable(self, hosts=None, limit=20.0):
        """Until every host's remote shell answers from the controller."""
        for h in hosts or self.hosts:
            deadline = time.monotonic() + limit
            while True:
                p = self.agent(self.controller, h, ["hostname"])
                if p.returncode == 0 and p.stdout.strip() == h.hostname:
                    break
                assert time.monotonic() < deadline, \
                    f"{h.name} unreachable: rc {p.returncode} {p.stderr.strip()}"
                time.sleep(0.05)

    # -- Open MPI
    def hostfile(self, slots=1, hosts=None, name="hostfile"):
        """An Open MPI (and fsdp-super) hosts file of the workers' addresses."""
        path = self.path(name)
        with open(path + ".new", "w") as f:  # whole or not at all: fsdp-super watches it
            for h in hosts or self.workers:
                f.write(f"{h.addr} slots={slots}\n")
        os.rename(path + ".new", path)
        return path

    def mpi_env(self, extra=None):
        """mpirun's environment on the controller: harness.ENV with the launch
        agent and both of Open MPI's TCP layers held to the test subnet."""
        env = dict(harness.ENV)
        env.update({
            "OMPI_MCA_plm_rsh_agent": AGENT,
            "OMPI_MCA_oob_tcp_if_include": CIDR,
            "OMPI_MCA_btl_tcp_if_include": CIDR,
            # the hosts share this machine's cores: binding every host's
            # first rank to core 0 would put them all on one core
            "OMPI_MCA_hwloc_base_binding_policy": "none",
            "FSDP_MH_HOSTMAP": self.hostmap,
        })
        env.update(extra or {})
        return env

    def mpirun(self, np, args, hostfile=None, env=None, mpi_args=(), **kw):
        """Starts mpirun on the controller; returns the Popen (text stdout/stderr pipes)."""
        cmd = ["mpirun", "-np", str(np), "--hostfile", hostfile or self.hostfile()]
        return self.controller.popen(cmd + list(mpi_args) + list(args), env=self.mpi_env(env),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, errors="replace", **kw)

    # -- what is left
    def job_processes(self):
        """{host name: [(pid, comm)]} of processes other than the hosts' own."""
        out = {}
        for h in self.hosts:
            if h.up():
                left = h.job_pids()
                if left:
                    out[h.name] = left
        return out

    def wait_no_job_processes(self, hosts=None, limit=10.0):
        """Until no job process is left on the hosts (default all); returns
        what is still there after `limit` seconds."""
        deadline = time.monotonic() + limit
        while True:
            left = {h.name: h.job_pids() for h in hosts or self.hosts if h.up()}
            left = {k: v for k, v in left.items() if v}
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.05)

    def teardown(self):
        """Kills every process of every host, deletes every namespace (the
        bridge with its own) and asserts nothing is left. Idempotent."""
        if self.torn_down:
            return
        self.torn_down = True
        nets = {h.netns for h in self.hosts if h.netns} | {getattr(self, "netns", None)}
        nets.discard(None)
        for h in self.hosts:
            if h.init_pid:
                try:
                    os.kill(h.init_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        left = kill_until_gone(net=nets, pid=self.seen_pidns, uts=self.seen_utsns)
        for h in self.hosts:
            if h.init:
                try:
                    h.init.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        for name in [h.ns for h in self.hosts] + [self.net]:
            if os.path.exists(os.path.join(NETNS_DIR, name)):
                sh(["ip", "netns", "del", name], check=False)
        stale = [n for n in os.listdir(NETNS_DIR) if n.startswith(self.id + "-")] \
            if os.path.isdir(NETNS_DIR) else []
        left = processes_in(net=nets, pid=self.seen_pidns, uts=self.seen_utsns) or left
        for h in self.hosts:
            _remove_session_files(h.hostname)
        assert not stale, f"namespaces left after teardown: {stale}"
        assert not left, f"processes left in the test hosts after teardown: {left}"


# ---------------------------------------------------------------- in-host programs

def _setns(path, nstype):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, nstype) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def exec_main(init_pid, cwd, argv):
    """hosts.py exec INIT_PID CWD -- ARGV: runs ARGV in the namespaces of the
    host whose init is INIT_PID. The parent stays outside (a process enters a
    PID namespace only by being forked into it), forwards signals to the
    child and exits as it did."""
    _setns(f"/proc/{init_pid}/ns/pid", CLONE_NEWPID)
    fds = {k: os.open(f"/proc/{init_pid}/ns/{k}", os.O_RDONLY) for k in ("net", "uts", "mnt")}
    child = os.fork()
    if child == 0:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: gone with the parent
            for kind, flag in (("net", CLONE_NEWNET), ("uts", CLONE_NEWUTS), ("mnt", CLONE_NEWNS)):
                if libc.setns(fds[kind], flag) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {kind}")
            os.chdir(cwd)
            os.execvp(argv[0], argv)
        except OSError as e:
            sys.stderr.write(f"hosts.py exec: {argv[0]}: {e}\n")
            os._exit(127)
    for fd in fds.values():
        os.close(fd)

    def forward(sig, _frame):
        try:
            os.kill(child, sig)
        except ProcessLookupError:
            pass
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT):
        signal.signal(sig, forward)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those cannot be caught anyway
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def init_main(hostname, addr):
    """hosts.py init HOSTNAME ADDR: pid 1 of a host. Sets the hostname, runs
    the remote shell server, reaps orphans until killed."""
    socket.sethostname(hostname)
    # the host's own RAM: a tmpfs of its mount namespace (private: unshare's
    # default), gone with the host, as a node's /dev/shm is at a power loss
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777,size=4g", "tmpfs", "/dev/shm"],
                   check=True)
    subprocess.Popen([PY, os.path.join(HERE, "rsh.py"), "serve", addr, str(rsh.PORT)],
                     stdin=subprocess.DEVNULL)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(1)
        except InterruptedError:
            pass


if __name__ == "__main__":
    if sys.argv[1] == "exec":
        assert sys.argv[4] == "--"
        exec_main(int(sys.argv[2]), sys.argv[3], sys.argv[5:])
    elif sys.argv[1] == "init":
        init_main(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"usage: {sys.argv[0]} exec INIT_PID CWD -- ARGV | init HOSTNAME ADDR")
