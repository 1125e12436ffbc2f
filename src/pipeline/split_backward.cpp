#include "split_backward.h"

#include <ATen/ops/ones_like.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <deque>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace pipetrain {
namespace {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

// What one intermediate node received in the first half.
struct Received {
  variable_list grads;
  bool armed = true;  // the second half runs the node again: record the first run only
};

class RecordGradients : public torch::autograd::FunctionPreHook {
 public:
  explicit RecordGradients(std::shared_ptr<Received> received) : received_(std::move(received)) {}
  variable_list operator()(const variable_list& grads) override {
    if (received_->armed) {
      received_->grads = grads;
      received_->armed = false;
    }
    return grads;
  }

 private:
  std::shared_ptr<Received> received_;
};

// One node of the graph below the roots, and the nodes with an edge to it.
struct GraphNode {
  std::shared_ptr<Node> node;
  std::vector<Node*> consumers;
};

// The graph from `roots` down.
std::unordered_map<Node*, GraphNode> graph_below(const edge_list& roots) {
  std::unordered_map<Node*, GraphNode> graph;
  std::deque<Node*> queue;
  auto visit = [&](const std::shared_ptr<Node>& node, Node* consumer) {
    auto [it, fresh] = graph.emplace(node.get(), GraphNode{node, {}});
    if (consumer != nullptr) it->second.consumers.push_back(consumer);
    if (fresh) queue.push_back(node.get());
  };
  for (const Edge& root : roots) {
    if (root.is_valid()) visit(root.function, nullptr);
  }
  while (!queue.empty()) {
    Node* node = queue.front();
    queue.pop_front();
    for (const Edge& next : node->next_edges()) {
      if (next.is_valid()) visit(next.function, node);
    }
  }
  return graph;
}

// The nodes with a path to one of `inputs`' accumulators: those the first half runs.
std::unordered_set<Node*> input_path(const std::unordered_map<Node*, GraphNode>& graph,
                                     const edge_list& inputs) {
  std::unordered_set<Node*> path;
  std::deque<Node*> queue;
  for (const Edge& input : inputs) {
    Node* node = input.function.get();
    if (graph.count(node) && path.insert(node).second) queue.push_back(node);
  }
  while (!queue.empty()) {
    Node* node = queue.front();
    queue.pop_front();
    for (Node* consumer : graph.at(node).consumers) {
      if (path.insert(consumer).second) queue.push_back(consumer);
    }
  }
  return path;
}

void add_defined(const Edge& edge, const at::Tensor& grad, edge_list* edges, variable_list* grads) {
  if (!grad.defined()) return;
  edges->push_back(edge);
  grads->push_back(grad);
}

}  // namespace

struct WeightBackward::Intermediates {
  struct Intermediate {
    std::shared_ptr<Node> node;  // keeps the graph below it alive until run()
    std::shared_ptr<Received> received;
    std::vector<size_t> on_path;  // which of its edges stay on the input path
  };
  std::vector<Intermediate> intermediates;
  // Roots off the input path (an output no input contributed to) take their gradient directly.
  edge_list root_edges;
  variable_list root_grads;
};

WeightBackward::WeightBackward() = default;
WeightBackward::~WeightBackward() = default;
WeightBackward::WeightBackward(WeightBackward&&) noexcept = default;
WeightBackward& WeightBackward::operator=(WeightBackward&&) noexcept = default;

WeightBackward WeightBackward::input_backward(const std::vector<at::Tensor>& roots,
                                              const std::vector<at::Tensor>& grads,
                                              const std::vector<at::Tensor>& inputs,
                                              std::vector<at::Tensor>* input_grads) {
  variable_list root_grads = grads;
  if (root_grads.empty()) {
    for (const at::Tensor& root : roots) {
      if (root.numel() != 1) {
        throw std::invalid_argument(
            "the loss must be a scalar to start a backward without a given gradient, got one of " +
            std::to_string(root.numel()) + " elements");
      }
      root_grads.push_back(at::ones_like(root));
    }
  }
  edge_list root_edges, input_edges;
  for (const at::Tensor& root : roots)
    root_edges.push_back(torch::autograd::impl::gradient_edge(root));
  for (const at::Tensor& input : inputs) {
    input_edges.push_back(torch::autograd::impl::gradient_edge(input));
  }
  const auto graph = graph_below(root_edges);
  const auto path = input_path(graph, input_edges);

  WeightBackward rest;
  rest.pending_ = std::make_unique<Intermediates>();
  for (size_t i = 0; i < root_edges.size(); ++i) {
    if (root_edges[i].is_valid() && !path.count(root_edges[i].function.get())) {
      add_defined(root_edges[i], root_grads[i], &rest.pending_->root_edges,
                  &rest.pending_->root_grads);
    }
  }
  for (const auto& [raw, graph_node] : graph) {
    if (!path.count(raw)) continue;
    Intermediates::Intermediate intermediate;
    bool leaves_path = false;
    for (size_t i = 0; i < raw->next_edges().size(); ++i) {
      const Edge& next = raw->next_edge(i);
      if (!next.is_valid()) continue;
      if (path.count(next.function.get())) {
        intermediate.on_path.push_back(i);
      } else {
        leaves_path = true;
      }
    }
    if (!leaves_path) continue;
    intermediate.node = graph_node.node;
    intermediate.received = std::make_shared<Received>();
    raw->add_pre_hook(std::make_unique<RecordGradients>(intermediate.received));
    rest.pending_->intermediates.push_back(std::move(intermediate));
  }

  *input_grads = torch::autograd::grad(roots, inputs, root_grads, /*retain_graph=*/true,
                                       /*create_graph=*/false, /*allow_unused=*/true);
  return rest;
}

void WeightBackward::run() {
  if (!pending_) return;
  const std::unique_ptr<Intermediates> pending = std::move(pending_);
  // The input half is done: cut the intermediates' edges along the input path, so that autograd
  // runs each intermediate for its edges off the path alone, and never reaches one intermediate
  // from another (which would count its gradient twice). Nothing else follows these edges: the
  // graph is this micro-batch's, and it is let go below.
  edge_list roots = pending->root_edges;
  variable_list grads = pending->root_grads;
  for (auto& intermediate : pending->intermediates) {
    for (size_t i : intermediate.on_path) intermediate.node->next_edges()[i] = Edge();
    const variable_list& received = intermediate.received->grads;
    for (size_t i = 0; i < received.size(); ++i) {
      add_defined(Edge(intermediate.node, static_cast<uint32_t>(i)), received[i], &roots, &grads);
    }
  }
  pending->intermediates.clear();  // the received gradients, as autograd takes them over
  if (roots.empty()) return;       // no gradient reached beyond the input path
  torch::autograd::Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/false,
                                                        /*create_graph=*/false,
                                                        /*accumulate_grad=*/true);
}

}  // namespace pipetrain
