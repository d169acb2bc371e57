package jail

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire protocol between the manager and a sandbox's init, one process per
// connection over a unixpacket socket (one message per packet):
//
//	manager -> init   request{argv, env, dir} + SCM_RIGHTS [stdin, stdout, stderr]
//	init -> manager   reply{started, pid} or reply{error, notFound}
//	                  (no started reply when request{collect}: one round trip)
//	manager -> init   request{signal}           (any number, optional)
//	init -> manager   reply{exited, code, signal}
//
// Closing the connection before the exit kills the command (its group and
// itself) when killOnClose was set. request{ping} answers reply{pong}.
//
// The encoding is binary, in the host's byte order (both ends run on the
// same machine, from the same binary), so that the C init (cinit.c) can
// read it without a JSON parser:
//
//	request  u8 kind ('P' ping, 'X' spawn, 'S' signal), u8 flags
//	         (1 killOnClose, 2 collect), u16 0, u32 signal; for a spawn
//	         then u32 argc, argc strings, u32 envc, envc strings, the
//	         directory string; a string is u32 length then its bytes
//	reply    u8 kind ('p' pong, 's' started, 'e' error, 'x' exited),
//	         u8 notFound, u16 0, i32 pid, i32 code, i32 signal, then the
//	         error message (the rest of the packet)
//
// Keep cinit.c in step with this file.
type request struct {
	Argv        []string
	Env         []string
	Dir         string
	KillOnClose bool
	// Collect: send no started reply, only the final one (Execute).
	Collect bool
	Signal  int
	Ping    bool
}

type reply struct {
	Pong     bool
	Started  bool
	Pid      int
	Error    string
	NotFound bool
	Exited   bool
	Code     int
	Sig      int

	lost bool // not on the wire: the connection was lost (rproc's reader)
}

const (
	kindPing    = 'P'
	kindSpawn   = 'X'
	kindSignal  = 'S'
	kindPong    = 'p'
	kindStarted = 's'
	kindError   = 'e'
	kindExited  = 'x'

	flagKillOnClose = 1
	flagCollect     = 2

	// maxPacket bounds one request (argv and environment can be large);
	// the init's receive buffer is this size.
	maxPacket = 1 << 20
	// maxStrings bounds argc+envc in one request.
	maxStrings = 1 << 16
)

var ne = binary.NativeEndian

func (r request) kind() byte {
	switch {
	case r.Ping:
		return kindPing
	case r.Signal > 0:
		return kindSignal
	}
	return kindSpawn
}

// marshal encodes r; a request over maxPacket is an error.
func (r request) marshal() ([]byte, error) {
	k := r.kind()
	var flags byte
	if r.KillOnClose {
		flags |= flagKillOnClose
	}
	if r.Collect {
		flags |= flagCollect
	}
	b := make([]byte, 8, 64)
	b[0], b[1] = k, flags
	ne.PutUint32(b[4:], uint32(r.Signal))
	if k != kindSpawn {
		return b, nil
	}
	putStrings := func(ss []string) {
		b = ne.AppendUint32(b, uint32(len(ss)))
		for _, s := range ss {
			b = ne.AppendUint32(b, uint32(len(s)))
			b = append(b, s...)
		}
	}
	putStrings(r.Argv)
	putStrings(r.Env)
	b = ne.AppendUint32(b, uint32(len(r.Dir)))
	b = append(b, r.Dir...)
	if len(b) > maxPacket {
		return nil, fmt.Errorf("command line and environment take %d bytes, over the %d the sandbox accepts", len(b), maxPacket)
	}
	if len(r.Argv)+len(r.Env) > maxStrings {
		return nil, fmt.Errorf("%d arguments and environment entries, over the %d the sandbox accepts", len(r.Argv)+len(r.Env), maxStrings)
	}
	return b, nil
}

var errShort = errors.New("truncated packet")

func (r *request) unmarshal(b []byte) error {
	*r = request{}
	if len(b) < 8 {
		return errShort
	}
	r.KillOnClose = b[1]&flagKillOnClose != 0
	r.Collect = b[1]&flagCollect != 0
	switch b[0] {
	case kindPing:
		r.Ping = true
		return nil
	case kindSignal:
		r.Signal = int(ne.Uint32(b[4:]))
		if r.Signal <= 0 || r.Signal > 64 {
			return fmt.Errorf("bad signal %d", r.Signal)
		}
		return nil
	case kindSpawn:
	default:
		return fmt.Errorf("unknown request kind %q", b[0])
	}
	b = b[8:]
	u32 := func() (int, error) {
		if len(b) < 4 {
			return 0, errShort
		}
		n := ne.Uint32(b)
		b = b[4:]
		return int(n), nil
	}
	str := func() (string, error) {
		n, err := u32()
		if err != nil {
			return "", err
		}
		if n > len(b) {
			return "", errShort
		}
		s := string(b[:n])
		b = b[n:]
		return s, nil
	}
	strs := func() ([]string, error) {
		n, err := u32()
		if err != nil {
			return nil, err
		}
		if n > maxStrings || n > len(b)/4 {
			return nil, errShort
		}
		out := make([]string, n)
		for i := range out {
			if out[i], err = str(); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	var err error
	if r.Argv, err = strs(); err != nil {
		return err
	}
	if r.Env, err = strs(); err != nil {
		return err
	}
	if r.Dir, err = str(); err != nil {
		return err
	}
	if len(b) != 0 {
		return errors.New("trailing bytes")
	}
	return nil
}

func (r reply) marshal() []byte {
	b := make([]byte, 16, 16+len(r.Error))
	switch {
	case r.Pong:
		b[0] = kindPong
	case r.Started:
		b[0] = kindStarted
	case r.Exited:
		b[0] = kindExited
	default:
		b[0] = kindError
	}
	if r.NotFound {
		b[1] = 1
	}
	ne.PutUint32(b[4:], uint32(int32(r.Pid)))
	ne.PutUint32(b[8:], uint32(int32(r.Code)))
	ne.PutUint32(b[12:], uint32(int32(r.Sig)))
	return append(b, r.Error...)
}

func (r *reply) unmarshal(b []byte) error {
	*r = reply{}
	if len(b) < 16 {
		return errShort
	}
	switch b[0] {
	case kindPong:
		r.Pong = true
	case kindStarted:
		r.Started = true
	case kindExited:
		r.Exited = true
	case kindError:
		r.Error = string(b[16:])
		if r.Error == "" {
			r.Error = "the sandbox's init refused the request"
		}
	default:
		return fmt.Errorf("unknown reply kind %q", b[0])
	}
	r.NotFound = b[1] != 0
	r.Pid = int(int32(ne.Uint32(b[4:])))
	r.Code = int(int32(ne.Uint32(b[8:])))
	r.Sig = int(int32(ne.Uint32(b[12:])))
	return nil
}
