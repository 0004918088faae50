package sinew

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sinewmq/sinew/protocol"
)

func TestErrPermissionDeniedMatchesOnlyItsCode(t *testing.T) {
	denied := fmt.Errorf("publish: %w", &BrokerError{Code: protocol.CodePermissionDenied, Message: "user alice may not publish to orders"})
	if !errors.Is(denied, ErrPermissionDenied) {
		t.Fatal("permission_denied does not match ErrPermissionDenied")
	}
	if !errors.Is(denied, &protocol.Error{Code: protocol.CodePermissionDenied}) {
		t.Fatal("permission_denied does not match its protocol error")
	}
	if IsRetryable(denied) {
		t.Fatal("permission_denied is retryable")
	}
	for _, c := range []protocol.Code{protocol.CodeAuthFailed, protocol.CodeBadRequest, protocol.CodeNotFound} {
		if errors.Is(&BrokerError{Code: c}, ErrPermissionDenied) {
			t.Errorf("%s matches ErrPermissionDenied", c)
		}
	}
}
