package main

import (
	"context"
	"net"
	"os"

	"github.com/containerd/log"
)

// sdNotifier speaks systemd's notify protocol for contrib/pinrt.service
// (Type=notify).
//
// It takes NOTIFY_SOCKET out of the environment as the daemon starts,
// because every process pinrt starts inherits that environment: `runc
// start` run with NOTIFY_SOCKET set binds a notify socket in the
// container's state dir and waits for the container to send READY=1,
// which a pod's container never does. go-systemd's SdNotify reads the
// variable on every call, so the one datagram each message needs is sent
// here.
type sdNotifier struct{ addr string }

func takeNotifySocket() sdNotifier {
	n := sdNotifier{addr: os.Getenv("NOTIFY_SOCKET")}
	_ = os.Unsetenv("NOTIFY_SOCKET")
	return n
}

// notify sends state ("READY=1", "STOPPING=1"); without a socket it does
// nothing. A failure is logged: systemd then times the unit out, which
// says more than a daemon that refuses to run.
func (n sdNotifier) notify(ctx context.Context, state string) {
	if n.addr == "" {
		return
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: n.addr, Net: "unixgram"})
	if err == nil {
		_, err = conn.Write([]byte(state))
		_ = conn.Close()
	}
	if err != nil {
		log.G(ctx).WithError(err).WithField("state", state).Warn("notifying systemd")
	}
}
