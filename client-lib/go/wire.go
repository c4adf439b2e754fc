package pgcoord

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/vmihailenco/msgpack/v5"
)

// The envelopes of MessagePack-RPC (PROTOCOL.md "Envelopes").
const (
	kindRequest      = 0
	kindResponse     = 1
	kindNotification = 2
)

// errIncomplete: the buffer holds the start of a message, not all of it.
var errIncomplete = errors.New("incomplete message")

// encodeRequest packs [0, msgid, method, [params]]. Integers are packed in
// their smallest form and map keys sorted, so every client sends the same
// bytes for the same call.
func encodeRequest(msgid uint32, method string, params map[string]interface{}) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	enc.SetSortMapKeys(true)
	if params == nil {
		params = map[string]interface{}{}
	}
	if err := enc.EncodeArrayLen(4); err != nil {
		return nil, err
	}
	_ = enc.EncodeInt(kindRequest)
	_ = enc.EncodeUint(uint64(msgid))
	_ = enc.EncodeString(method)
	_ = enc.EncodeArrayLen(1)
	if err := enc.Encode(params); err != nil {
		return nil, fmt.Errorf("pgcoord: encoding %s params: %w", method, err)
	}
	return buf.Bytes(), nil
}

// frameLen returns the length of the first MessagePack object in b, or
// errIncomplete when b ends inside it. Any other error is garbage.
func frameLen(b []byte) (int, error) {
	r := bytes.NewReader(b)
	d := msgpack.NewDecoder(r)
	if err := d.Skip(); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, errIncomplete
		}
		return 0, err
	}
	return len(b) - r.Len(), nil
}

// message is one decoded envelope from the agent.
type message struct {
	kind   int
	msgid  uint32
	err    *Error
	result msgpack.RawMessage
	method string
	params msgpack.RawMessage // always a map ([] becomes {})
}

type wireError struct {
	Code      string `msgpack:"code"`
	Message   string `msgpack:"message"`
	Retryable bool   `msgpack:"retryable"`
}

var emptyMap = msgpack.RawMessage{0x80}

// decodeMessage reads one complete frame as a response or notification.
func decodeMessage(frame []byte) (*message, error) {
	d := msgpack.NewDecoder(bytes.NewReader(frame))
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, fmt.Errorf("not an envelope array: %w", err)
	}
	kind, err := d.DecodeInt()
	if err != nil {
		return nil, fmt.Errorf("envelope kind: %w", err)
	}
	m := &message{kind: kind}
	switch {
	case kind == kindResponse && n == 4:
		id, err := d.DecodeInt64()
		if err != nil || id < 0 || id > 0xffffffff {
			return nil, fmt.Errorf("response msgid is not a uint32")
		}
		m.msgid = uint32(id)
		var we *wireError
		if err := d.Decode(&we); err != nil {
			return nil, fmt.Errorf("response error: %w", err)
		}
		if we != nil {
			if we.Code == "" {
				return nil, fmt.Errorf("response error has no code")
			}
			m.err = &Error{Code: we.Code, Message: we.Message, Retryable: we.Retryable}
		}
		if m.result, err = d.DecodeRaw(); err != nil {
			return nil, fmt.Errorf("response result: %w", err)
		}
	case kind == kindNotification && n == 3:
		if m.method, err = d.DecodeString(); err != nil {
			return nil, fmt.Errorf("notification method: %w", err)
		}
		pn, err := d.DecodeArrayLen()
		if err != nil || pn > 1 {
			return nil, fmt.Errorf("notification params are not [map]")
		}
		m.params = emptyMap
		if pn == 1 {
			c, err := d.PeekCode()
			if err != nil {
				return nil, err
			}
			if !isMapCode(c) {
				return nil, fmt.Errorf("notification params are not [map]")
			}
			if m.params, err = d.DecodeRaw(); err != nil {
				return nil, err
			}
		}
	default:
		return nil, fmt.Errorf("envelope kind %d with %d elements", kind, n)
	}
	return m, nil
}

func isMapCode(c byte) bool {
	return (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf
}
