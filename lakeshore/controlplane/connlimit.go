package controlplane

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// refusedLogEvery paces the log line about refused connections: a flood of
// them must not become a flood of log lines.
const refusedLogEvery = 10 * time.Second

// perIPListener caps the connections open at once from one remote address.
// Over the cap a new connection is closed as soon as it is accepted, before
// a byte is read from it (under TLS, before the handshake: the listener is
// below TLS). The address is the exact IP: a whole IPv6 /64 of one host
// counts as many addresses.
type perIPListener struct {
	net.Listener
	max int
	log zerolog.Logger

	mu   sync.Mutex
	open map[netip.Addr]int
	// refused counts the connections refused since the last log line,
	// which may not come before nextLog.
	refused int
	nextLog time.Time
}

func newPerIPListener(ln net.Listener, max int, log zerolog.Logger) *perIPListener {
	return &perIPListener{Listener: ln, max: max, log: log, open: map[netip.Addr]int{}}
}

// Accept returns the next connection within the cap, closing those over it.
func (l *perIPListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := remoteIP(c)
		if l.take(ip) {
			return &countedConn{Conn: c, release: func() { l.release(ip) }}, nil
		}
		_ = c.Close()
	}
}

// take counts one more connection from ip, if the cap allows it.
func (l *perIPListener) take(ip netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[ip] < l.max {
		l.open[ip]++
		return true
	}
	l.refused++
	if now := time.Now(); !now.Before(l.nextLog) {
		l.log.Warn().Str("remote_ip", ip.String()).Int("max_conns_per_ip", l.max).Int("refused", l.refused).
			Msg("connections refused: this address has as many open as it may (--max-conns-per-ip)")
		l.refused, l.nextLog = 0, now.Add(refusedLogEvery)
	}
	return false
}

func (l *perIPListener) release(ip netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[ip]--; l.open[ip] <= 0 {
		delete(l.open, ip)
	}
}

// remoteIP is the connection's peer address without its port (and an
// IPv4-mapped IPv6 address as IPv4); an address that is not IP is the
// zero Addr, one bucket for all of them.
func remoteIP(c net.Conn) netip.Addr {
	switch a := c.RemoteAddr().(type) {
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	case nil:
		return netip.Addr{}
	}
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// countedConn gives its slot back when closed, once however often it is
// closed.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// NetConn is the connection counted (a parked poll looks at its socket).
func (c *countedConn) NetConn() net.Conn { return c.Conn }

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
