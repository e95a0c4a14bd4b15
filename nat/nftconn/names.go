// Package nftconn is natgw's one way to write an nftables table that is
// not the main one's bulk path: every table name natgw owns (and the
// chain and map names of the tables laid out over it) as a const, a
// transaction as a
// value (Tx) that renders as nft text without a kernel, a connection
// (Conn) that sends a Tx as one netlink batch in a namespace, and a Fake
// connection that keeps the table in memory and dumps it as `nft list
// table` would (knftables' Fake and Dump shape), for golden tests that
// run without root.
//
// Users: gwimage/lbsvc (table ip natgw_lbsvc), gwimage/vpclb (tables ip
// and ip6 natgw_vpclb), nat/planes (removal of the other plane's table
// inet/ip natgw), nat/gwqos (table ip natgw_gwqos, two chains; it finds
// its rules by their tags), nat/shape (table ip natgw_shape: two maps of
// classids and a chain that looks them up). Each of these tables' chain
// and map names is a typed const (ChainName, MapName) in names.go. The
// main table's layout (nat/nftables) keeps its own transaction encoder,
// which batches tens of thousands of set elements per transaction, but
// takes its table name and its base chain rendering from here.
package nftconn

// TableName is the name of a table natgw writes: one of the consts below,
// the one place each is spelled. Packages refer to them here (no package
// re-exports one), so a table name cannot be mistaken for a chain's or a
// set's.
type TableName string

// The tables natgw writes. natgw changes only these.
const (
	// MainTable is the data plane's table, family inet (layouts 1-3: ip),
	// laid out by nat/nftables (nat/README.md).
	MainTable TableName = "natgw"
	// GatewayQoSTable is the gateway-wide QoS table, family ip
	// (nat/gwqos).
	GatewayQoSTable TableName = "natgw_gwqos"
	// ShapeTable holds the EIP shaping maps, family ip (nat/shape).
	ShapeTable TableName = "natgw_shape"
	// LBSvcTable holds lb-svc.sh's DNAT and masquerade rules, family ip
	// (gwimage/lbsvc).
	LBSvcTable TableName = "natgw_lbsvc"
	// VPCLBTable holds the VPC LB init containers' masquerade rules,
	// families ip and ip6 (gwimage/vpclb).
	VPCLBTable TableName = "natgw_vpclb"
)

// Sets of MainTable that other packages refer to (tests that break the
// table behind the agent's back); nat/README.md has the whole layout.
const (
	MainSetFIPDNAT = "fip_dnat"
	MainSetFIPSNAT = "fip_snat"
)

// ChainName is the name of a chain of one of natgw's tables; MapName a
// map's. Each table's layout names its chains and maps in its block below,
// the one place each is spelled.
type (
	ChainName string
	MapName   string
)

// GatewayQoSTable's chains (nat/gwqos): ingress classifies before DNAT,
// egress after SNAT.
const (
	GatewayQoSIngressChain ChainName = "ingress"
	GatewayQoSEgressChain  ChainName = "egress"
)

// ShapeTable's chain and maps (nat/shape): one chain that looks a packet's
// classid up in the map of its direction.
const (
	ShapePostChain ChainName = "post"
	// ShapeIngressMap is keyed by the connection's ct mark (the EIP).
	ShapeIngressMap MapName = "ingress"
	// ShapeEgressMap is keyed by the source address.
	ShapeEgressMap MapName = "egress"
)

// LBSvcTable's chains (gwimage/lbsvc): NAT prerouting (the DNATs) and NAT
// postrouting (the masquerades).
const (
	LBSvcPreroutingChain  ChainName = "prerouting"
	LBSvcPostroutingChain ChainName = "postrouting"
)

// VPCLBTable's chain (gwimage/vpclb): NAT postrouting (the masquerades).
const VPCLBPostroutingChain ChainName = "postrouting"
