// A producer as a Java shop writes one: the JDK's default HttpClient (HTTP/2 preferred, so
// on http:// it offers "Upgrade: h2c" with every request), used against delayq api.
// Run: java Client.java BASE_URL TOKEN QUEUE. Prints one line per request: STATUS BODY.
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

public class Client {
    public static void main(String[] args) throws Exception {
        String base = args[0], token = args[1], queue = args[2];
        HttpClient client = HttpClient.newHttpClient();
        String tasks = base + "/v1/queues/" + queue + "/tasks";
        String[] bodies = {
            "{\"kind\": \"order.close\", \"payload\": {\"order_id\": 42}, \"delay\": \"15m\", \"id\": \"order-close:42\"}",
            "{\"kind\": \"order.close\", \"payload\": {\"order_id\": 43}, \"delay\": 900, \"id\": \"order-close:43\"}",
        };
        for (String body : bodies) {
            HttpRequest post = HttpRequest.newBuilder(URI.create(tasks))
                .header("Authorization", "Bearer " + token)
                .header("Content-Type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(body))
                .build();
            print(client.send(post, HttpResponse.BodyHandlers.ofString()));
        }
        HttpRequest patch = HttpRequest.newBuilder(URI.create(tasks + "/order-close:42"))
            .header("Authorization", "Bearer " + token)
            .header("Content-Type", "application/json")
            .method("PATCH", HttpRequest.BodyPublishers.ofString("{\"delay\": \"1h\"}"))
            .build();
        print(client.send(patch, HttpResponse.BodyHandlers.ofString()));
        HttpRequest get = HttpRequest.newBuilder(URI.create(tasks + "/order-close:42"))
            .header("Authorization", "Bearer " + token)
            .build();
        print(client.send(get, HttpResponse.BodyHandlers.ofString()));
        HttpRequest head = HttpRequest.newBuilder(URI.create(base + "/healthz"))
            .method("HEAD", HttpRequest.BodyPublishers.noBody())
            .build();
        print(client.send(head, HttpResponse.BodyHandlers.ofString()));
    }

    static void print(HttpResponse<String> r) {
        System.out.println(r.statusCode() + " " + r.version() + " " + r.body());
    }
}
