//go:build tools

// Package tools pins modules the project will use before any package imports
// them, so `go mod tidy` keeps them.
package tools

import (
	_ "github.com/google/go-containerregistry/pkg/v1"
	_ "github.com/google/nftables"
	_ "github.com/mdlayher/netlink"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/ti-mo/conntrack"
	_ "github.com/vishvananda/netlink"
	_ "sigs.k8s.io/yaml"
)
