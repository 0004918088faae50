package delivery

import (
	"reflect"
	"testing"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/protocol"
)

func TestHeaders(t *testing.T) {
	if got := Headers([]queue.Header(nil)); got != nil {
		t.Fatalf("no headers: %v, want nil", got)
	}
	in := []queue.Header{{Key: "a", Value: "1"}, {Key: "b", Value: ""}}
	want := []protocol.Header{{Key: "a", Value: "1"}, {Key: "b", Value: ""}}
	if got := Headers(in); !reflect.DeepEqual(got, want) {
		t.Fatalf("Headers(%v) = %v, want %v", in, got, want)
	}
}
