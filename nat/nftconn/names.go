// Package nftconn is natgw's one way to talk to nftables: every table
// name natgw owns (and the chain and map names of the tables laid out
// over it, typed ChainName and MapName) as a const, a transaction as a
// value (Tx) that renders as nft text without a kernel, a connection
// (Conn) that sends a Tx as one netlink batch in a namespace, and a Fake
// connection that keeps the table in memory and dumps it as `nft list
// table` would (knftables' Fake and Dump shape), for golden tests that
// run without root.
//
// # Layers
//
// From the bottom:
//   - Batch (batch.go): one netlink batch being encoded in one buffer.
//     Structural messages go through mdlayher/netlink's attribute encoder
//     (Msg); set elements, the bulk of a large transaction, are written
//     straight into the buffer (Elements: 15x faster than the encoder at
//     200,000 elements). Close keeps the ack flag on the last message
//     only: one answer for the whole batch, and acks cannot overrun the
//     receive buffer.
//   - Socket (socket.go): a lasting nf_tables netlink socket over
//     nat/nlsock. Commit sends a Batch in one sendmsg and reads the
//     answers up to the last message's; Classify tells a rejected batch
//     (nothing changed) from an unknown outcome (nat.ErrUnknownState).
//     Dump and Get send a request and read its answers up to their end
//     (Request numbers the requests a caller sends on it).
//   - The decoder (decode.go): the one walker of nf_tables netlink
//     answers in natgw (Attrs, DumpEnd, DecodeReply, ElemList,
//     DecodeElem, ...), in place, only the attributes a reader uses; it
//     decodes Conn's reads (read.go) and nat/nftables' Load.
//   - Tx (tx.go, set.go) and Tx.Encode (encode.go): the operations of one
//     transaction, in the bytes google/nftables would send for them
//     (TestEncodeMatchesLibrary, TestEncodeSetsMatchLibrary), and their
//     nft text (String; text.go renders a Set's elements and limit
//     objects from their types, only when shown).
//   - Conn (conn.go): Netlink encodes a Tx and commits it over a Socket
//     dialed per call, and reads (Tables, Rules, MapElements: read.go)
//     with one dump on such a Socket each, decoded into what RuleRef and
//     Element carry (a rule's expressions are not decoded); Lasting
//     (lasting.go) keeps one Socket for its life for both, and redials
//     after a failed commit; Fake applies a Tx in memory.
//
// # Users
//
// Every table natgw writes is planned into a Tx. gwimage/lbsvc (table ip
// natgw_lbsvc), gwimage/vpclb (tables ip and ip6 natgw_vpclb), nat/planes
// (removal of the other plane's table inet/ip natgw), nat/gwqos (table ip
// natgw_gwqos, two chains; it finds its rules by their tags), nat/shape
// (table inet natgw_shape: three maps of classids and a chain that looks
// them up) apply theirs through Conn (Netlink). The main table
// (nat/nftables) plans into a Tx too (its txPlan fixes table inet natgw):
// sets with concatenated keys, elements by the 100,000 without a copy or
// a text each, limit objects, rules with nft comments, the generation
// stamp on natgw_meta. It keeps a Lasting for its life (a small
// transaction costs ~11 µs: no dial per call), encodes each Tx into a
// Batch sized once (Tx.SizeHint) on the Lasting's Socket, where the
// Socket reuses a small batch's buffer, and commits it there; every read
// of its Load (the structure, the sets' elements, the generation) is a
// request on that Socket (Socket.Dump, Request), decoded by this
// package's attribute walker (moving the structure's reads off the
// library's connection saved ~0.4M instructions and 845 allocations of a
// Load of a small table; BenchmarkLoadSmall). Its golden text and its
// kernel listing test model the table with Fake.
//
// # Design
//
// One encoder, one decoder, one socket and one transaction type for every
// table: every batch natgw sends is a Tx encoded into an nftconn.Batch and
// committed by an nftconn.Socket (Classify's rejected/unknown split, one
// ack per batch, the send buffer raised for a large batch, no rule echoed
// back: TestNetlinkManyRules); every read is
// a dump on an nftconn.Socket decoded by decode.go; set IDs come
// from one process counter (SetIDs); base chains encode and render
// through Chain (ChainAttrs, Header); the encoding is checked against
// google/nftables' bytes by one comparison (LibraryMessages,
// Batch.DiffLibrary).
//
// google/nftables is used for its types, constants and expression
// encoding (expr.Marshal), never for a connection to the kernel: its
// Conn appears only in LibraryMessages, a test dial without a socket
// that the encoding tests compare with, and in TestReadsMatchLibrary,
// the reference of the reads. Left: Fake does not model references (a
// delete of a chain, set or limit object in use is refused by the kernel
// only).
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
	// ShapeTable holds the EIP shaping maps, family inet (before: ip; see
	// nat/shape).
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
	// ShapeEgressMap is keyed by the IPv4 source address.
	ShapeEgressMap MapName = "egress"
	// ShapeEgress6Map is keyed by the IPv6 source address.
	ShapeEgress6Map MapName = "egress6"
)

// LBSvcTable's chains (gwimage/lbsvc): NAT prerouting (the DNATs) and NAT
// postrouting (the masquerades).
const (
	LBSvcPreroutingChain  ChainName = "prerouting"
	LBSvcPostroutingChain ChainName = "postrouting"
)

// VPCLBTable's chain (gwimage/vpclb): NAT postrouting (the masquerades).
const VPCLBPostroutingChain ChainName = "postrouting"
