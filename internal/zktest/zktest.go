// Package zktest runs a real ZooKeeper server for tests: Debian's
// zookeeper package (`apt-get install zookeeper`, which .ci/run does),
// started with its Java in standalone mode on a loopback port, with a data
// directory of the test's own, so that it can be stopped and started again
// with its sessions and nodes.
//
// Without Java or the package the tests skip, unless
// SHARDPILOT_REQUIRE_ZOOKEEPER is set (make test sets it), in which case
// they fail. SHARDPILOT_ZOOKEEPER_CLASSPATH overrides the class path
// (for example the jars of an upstream release).
package zktest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
)

// DefaultClassPath is where Debian's zookeeper package puts its jar and
// configuration.
const DefaultClassPath = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"

// TickTime is the server's tick in milliseconds: sessions may time out
// from two ticks (2 s) to twenty (20 s).
const TickTime = 1000

// Server is a running ZooKeeper server.
type Server struct {
	// Addr is its host:port.
	Addr string
	t    testing.TB
	java string
	cp   string
	dir  string
	port int
	cmd  *exec.Cmd
	log  *os.File
}

// Start starts a server for the test; it stops when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	java, cp, err := find()
	if err != nil {
		if os.Getenv("SHARDPILOT_REQUIRE_ZOOKEEPER") != "" {
			t.Fatalf("zktest: %v (install it: apt-get install zookeeper)", err)
		}
		t.Skipf("zktest: %v; install Debian's zookeeper package to run this test", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), t: t, java: java, cp: cp, dir: t.TempDir(), port: port}
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

func find() (java, cp string, err error) {
	java, err = exec.LookPath("java")
	if err != nil {
		return "", "", fmt.Errorf("no java on PATH")
	}
	cp = os.Getenv("SHARDPILOT_ZOOKEEPER_CLASSPATH")
	if cp == "" {
		if _, err := os.Stat("/usr/share/java/zookeeper.jar"); err != nil {
			return "", "", fmt.Errorf("no ZooKeeper: /usr/share/java/zookeeper.jar is missing")
		}
		cp = DefaultClassPath
	}
	return java, cp, nil
}

// Restart starts the server (again, after Stop) on the same port and data,
// and waits until it serves.
func (s *Server) Restart() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatal("zktest: the server is running")
	}
	log, err := os.OpenFile(filepath.Join(s.dir, "zookeeper.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(s.java, "-Xmx256m", "-Dzookeeper.admin.enableServer=false", "-Dzookeeper.4lw.commands.whitelist=ruok",
		"-cp", s.cp, "org.apache.zookeeper.server.ZooKeeperServerMain", fmt.Sprint(s.port), filepath.Join(s.dir, "data"), fmt.Sprint(TickTime))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		s.t.Fatalf("zktest: start ZooKeeper: %v", err)
	}
	s.cmd, s.log = cmd, log
	deadline := time.Now().Add(60 * time.Second)
	for !s.ok() {
		if time.Now().After(deadline) {
			s.Stop()
			s.t.Fatalf("zktest: ZooKeeper did not answer on %s within 60s; its log: %s", s.Addr, filepath.Join(s.dir, "zookeeper.log"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ok asks the server "ruok".
func (s *Server) ok() bool {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("ruok")); err != nil {
		return false
	}
	line, _ := bufio.NewReader(c).ReadString('\n')
	return line == "imok"
}

// Stop stops the server (SIGTERM, then SIGKILL), keeping its data.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	s.log.Close()
	s.cmd, s.log = nil, nil
}

// Connect opens a ZooKeeper session of its own to addr (a server's, or a
// proxy's in front of it) and waits until it is established; it closes
// when the test ends.
func Connect(t testing.TB, addr string, timeout time.Duration) *zk.Conn {
	t.Helper()
	return connect(t, addr, timeout, quiet{}, false)
}

// ConnectLogged is Connect, keeping what the client logs (its
// reconnections, and why the server refused one) in log.
func ConnectLogged(t testing.TB, addr string, timeout time.Duration, log *Log) *zk.Conn {
	t.Helper()
	return connect(t, addr, timeout, log, true)
}

// Log keeps what a client logs, for a test to show when it fails.
type Log struct {
	mu    sync.Mutex
	lines []string
}

func (l *Log) Printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
}

// String returns the last 40 lines logged.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines[max(0, len(l.lines)-40):], "\n")
}

// LogTail returns the last n lines of the server's log.
func (s *Server) LogTail(n int) string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "zookeeper.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func connect(t testing.TB, addr string, timeout time.Duration, log zk.Logger, info bool) *zk.Conn {
	t.Helper()
	c, _, err := zk.Connect([]string{addr}, timeout, zk.WithLogInfo(info), zk.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	deadline := time.Now().Add(30 * time.Second)
	for c.State() != zk.StateHasSession {
		if time.Now().After(deadline) {
			t.Fatalf("zktest: no ZooKeeper session with %s within 30s (%s)", addr, c.State())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return c
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}
