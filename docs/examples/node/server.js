// A small web server: started by the build (the recipe's CMD) and saved running,
// so every VM of the image answers at once, with how long it has been up.
const http = require("http");

const started = Date.now();
const port = Number(process.env.PORT || 8080);

http.createServer((req, res) => {
  res.writeHead(200, { "Content-Type": "application/json" });
  res.end(JSON.stringify({
    hello: "from a Rift image built from a recipe",
    node: process.version,
    path: req.url,
    up_s: Math.round((Date.now() - started) / 1000),
  }) + "\n");
}).listen(port, "0.0.0.0", () => console.log(`listening on ${port}`));
