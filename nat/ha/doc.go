// Package ha runs one replica of a highly available (active/standby)
// gateway: UDP heartbeats with the peer over the internal network, a role
// state machine whose leadership is fenced by a lease (Fence), the floating
// addresses (EIPs on the external interface, the lanIp on the internal one)
// that only the active holds and announces with gratuitous ARP, and the
// replication of the active's NATed conntrack entries to the standby
// (package ctsync). Both replicas carry the same nftables rules, programmed
// by the normal data plane without address plumbing
// (nftables.WithoutPlumbing); see README.md in this directory for the
// design, the protocol and the measured figures.
package ha
