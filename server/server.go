// Package server implements the CRI v1 RuntimeService and ImageService.
//
// It is the only package that knows the CRI protobuf types. A handler
// converts its request, calls one domain operation on the packages below
// (nsmgr, cni, sandbox, image, oci) through the small interfaces declared
// here, and converts the result. Errors are returned as errdefs classes;
// the interceptors in instrument.go map them to gRPC codes.
package server

import (
	"context"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/conf"
)

// Network is the pod network (package cni).
type Network interface {
	// Status is nil exactly when a usable network config exists.
	Status() error
}

// Deps are the side-effect boundaries the server drives.
type Deps struct {
	Network Network
}

// Server serves CRI. RPCs not built yet answer Unimplemented through the
// embedded generated types.
type Server struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	cfg  *conf.Config
	deps Deps
}

// New returns a server for cfg driving deps.
func New(cfg *conf.Config, deps Deps) *Server {
	return &Server{cfg: cfg, deps: deps}
}

// Register adds both CRI services to g.
func (s *Server) Register(g *grpc.Server) {
	runtimeapi.RegisterRuntimeServiceServer(g, s)
	runtimeapi.RegisterImageServiceServer(g, s)
}

// Close releases what the server holds. It leaves pods and containers
// running: they outlive the daemon by design.
func (s *Server) Close(ctx context.Context) error { return nil }
