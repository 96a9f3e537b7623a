package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// maxMsgSize matches kubelet's 16 MiB limit, so large List responses from a
// dense node do not fail in the tool where they would work in kubelet.
const maxMsgSize = 16 << 20

// Client is a CRI connection with one bounded timeout for every RPC.
type Client struct {
	conn    *grpc.ClientConn
	Runtime runtimeapi.RuntimeServiceClient
	Image   runtimeapi.ImageServiceClient
	Timeout time.Duration
}

// Target turns an endpoint as kubelet and crictl accept it ("unix:///x.sock"
// or a bare absolute path) into a gRPC target.
func Target(endpoint string) (string, error) {
	switch {
	case strings.HasPrefix(endpoint, "unix://"):
		return endpoint, nil
	case strings.HasPrefix(endpoint, "/"):
		return "unix://" + endpoint, nil
	}
	return "", fmt.Errorf("endpoint %q: only unix:// endpoints and absolute socket paths are supported", endpoint)
}

// Dial connects lazily to endpoint; errors show up on the first RPC.
func Dial(endpoint string, timeout time.Duration) (*Client, error) {
	target, err := Target(endpoint)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize), grpc.MaxCallSendMsgSize(maxMsgSize)),
		// The default reconnect backoff grows to two minutes. After a
		// runtime restart that would be measured as the runtime's restore
		// time, so keep the retry interval short and flat.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.5, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", endpoint, err)
	}
	return &Client{
		conn:    conn,
		Runtime: runtimeapi.NewRuntimeServiceClient(conn),
		Image:   runtimeapi.NewImageServiceClient(conn),
		Timeout: timeout,
	}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// rpc returns a context bounded by the client's per-RPC timeout.
func (c *Client) rpc(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.Timeout)
}
