package sqs

import (
	"io"
	"net/http"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
)

// KeepRequestBody wraps an SQS client's HTTP client so that the SDK's early
// close of a request body cannot fail the request.
//
// The SDK closes a request's body as soon as Do returns, which is when the
// response's headers are in. net/http may still be reading that body then
// (a last read for bytes past its Content-Length, after the server has the
// whole request and may have answered), and the SDK's closed body answers
// WriteTo with io.EOF, which io.Copy passes on as an error. The transport
// takes it for a failed request write and closes the connection under the
// response that is still being read: the call fails with "use of closed
// network connection" although the server served it, and the SDK retries
// it. For a ReceiveMessage that is worse than a failure: the served
// messages stay invisible for their visibility timeout. Against fauxqs,
// which answers within that window, a busy client meets it often (253
// failed request writes in one run of the SQS benchmarks, a few of them
// under a response still being read); over a network the window is
// narrower, not closed.
//
// The wrapper hides the body's WriteTo, so that io.Copy reads it, and a
// read at EOF ends a copy without an error. The URL opener's clients use
// it; wrap the HTTP client of an awssqs.Client made by hand with it too:
//
//	client := awssqs.New(awssqs.Options{HTTPClient: sqs.KeepRequestBody(&http.Client{}), ...})
func KeepRequestBody(c awssqs.HTTPClient) awssqs.HTTPClient { return keptBody{c} }

type keptBody struct{ c awssqs.HTTPClient }

func (k keptBody) Do(req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.Body != http.NoBody {
		req.Body = struct {
			io.Reader
			io.Closer
		}{req.Body, req.Body}
	}
	return k.c.Do(req)
}
