// Close unpaid orders through delayq's HTTP API, with the JDK's own HTTP client (Java 11+).
// Placing an order schedules its close; a payment cancels it; extending the payment window
// reschedules it. Run: java CloseOrder.java BASE_URL TOKEN QUEUE
// (tests/test_http_java.py runs it against delayq api and a worker).
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;

public class CloseOrder {
    /** The three calls an order service needs; one client for the whole application. */
    static class Delayq {
        private final HttpClient http = HttpClient.newHttpClient(); // the default client
        private final String tasks;
        private final String token;

        Delayq(String base, String token, String queue) {
            this.tasks = base + "/v1/queues/" + queue + "/tasks";
            this.token = token;
        }

        /** Close the order after `delay` ("15m", "90s" or seconds); the id makes a resend a no-op. */
        String scheduleClose(long orderId, String delay) throws Exception {
            String body = "{\"kind\": \"order.close\", \"id\": \"order-close:" + orderId + "\", "
                + "\"payload\": {\"order_id\": " + orderId + "}, \"delay\": \"" + delay + "\"}";
            return send("POST", tasks, body, 201, 200);
        }

        /** The order was paid: its close must not run (204; 404 if it is already gone). */
        String cancelClose(long orderId) throws Exception {
            return send("DELETE", tasks + "/" + id(orderId), null, 204, 404);
        }

        /** The customer got more time: the close moves to `delay` from now. */
        String rescheduleClose(long orderId, String delay) throws Exception {
            return send("PATCH", tasks + "/" + id(orderId), "{\"delay\": \"" + delay + "\"}", 200);
        }

        private static String id(long orderId) {
            return URLEncoder.encode("order-close:" + orderId, StandardCharsets.UTF_8);
        }

        private String send(String method, String url, String json, int... ok) throws Exception {
            HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(url))
                .header("Authorization", "Bearer " + token);
            if (json == null) {
                request.method(method, HttpRequest.BodyPublishers.noBody());
            } else {
                request.header("Content-Type", "application/json")
                    .method(method, HttpRequest.BodyPublishers.ofString(json));
            }
            HttpResponse<String> r = http.send(request.build(), HttpResponse.BodyHandlers.ofString());
            for (int status : ok) {
                if (r.statusCode() == status) {
                    return r.statusCode() + " " + r.body();
                }
            }
            // Every error is application/problem+json: its "detail" says what to fix.
            throw new IllegalStateException(method + " " + url + ": " + r.statusCode() + " " + r.body());
        }
    }

    public static void main(String[] args) throws Exception {
        Delayq delayq = new Delayq(args[0], args[1], args[2]);
        System.out.println("placed 1001: " + delayq.scheduleClose(1001, "2s"));
        System.out.println("placed 1002: " + delayq.scheduleClose(1002, "3s"));
        System.out.println("placed 1003: " + delayq.scheduleClose(1003, "1h"));
        System.out.println("paid 1002: " + delayq.cancelClose(1002));
        System.out.println("extended 1003: " + delayq.rescheduleClose(1003, "4s"));
    }
}
